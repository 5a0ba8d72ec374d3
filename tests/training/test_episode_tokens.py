"""The token mask of a multi-turn episode covers exactly the tokens the model sampled."""

from __future__ import annotations

import json

import pytest

from training.trainer.episode_tokens import episode_segments, episode_tokens

TOOLS = [{"type": "function", "function": {"name": "write_file", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_episode_tokens_by_hand():
    ids, mask = episode_tokens([([1, 2, 3], False), ([4, 5], True), ([6], False), ([7, 8, 9], True)])
    assert ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert mask == [0, 0, 0, 1, 1, 0, 1, 1, 1]
    assert episode_tokens([]) == ([], [])


def pieces(tokenizer, text: str) -> list[int]:
    """Token ids for `text`, one character at a time: a tokenisation the tokenizer itself
    would never produce, so a mask built by re-tokenising would not match it."""
    return [i for ch in text for i in tokenizer(ch, add_special_tokens=False)["input_ids"]]


def test_the_mask_covers_exactly_the_sampled_tokens_of_a_two_turn_episode(tokenizer):
    eos = tokenizer.eos_token_id
    call = {"name": "write_file", "arguments": {"path": "a.txt", "content": "hi"}}
    turn0 = f"<tool_call>{json.dumps(call)}</tool_call>"
    sampled = [[*pieces(tokenizer, turn0), eos], [*pieces(tokenizer, "Done."), eos]]
    messages = [
        {"role": "system", "content": "Work on files."},
        {"role": "user", "content": "Write hi to a.txt"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c0",
                    "type": "function",
                    "function": {"name": "write_file", "arguments": json.dumps(call["arguments"])},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "name": "write_file", "content": "wrote 2 bytes to a.txt"},
        {"role": "assistant", "content": "Done."},
    ]
    ids, mask = episode_tokens(episode_segments(tokenizer, messages, TOOLS, sampled))

    # By hand: the context before turn 0 is the template up to the first assistant header;
    # between the turns the model reads the newline after its end-of-turn token, the tool
    # result and the next header.
    c0 = tokenizer(
        tokenizer.apply_chat_template(messages[:2], tools=TOOLS, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    )["input_ids"]
    c1 = tokenizer(
        "\n<|im_start|>tool\n<tool_response>wrote 2 bytes to a.txt</tool_response><|im_end|>\n<|im_start|>assistant\n",
        add_special_tokens=False,
    )["input_ids"]
    assert ids == c0 + sampled[0] + c1 + sampled[1]
    assert mask == [0] * len(c0) + [1] * len(sampled[0]) + [0] * len(c1) + [1] * len(sampled[1])
    # The trained tokens are the sampled ones, in order, end-of-turn tokens included.
    assert [t for t, m in zip(ids, mask, strict=True) if m] == sampled[0] + sampled[1]
    # And the whole sequence reads as the chat template's rendering of the episode.
    whole = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert tokenizer.decode(ids) == whole.rstrip("\n")


def test_generation_context_is_the_training_prefix(tokenizer):
    """The context the model generates turn 1 from is exactly the prefix of the training
    sequence before turn 1's tokens."""
    eos = tokenizer.eos_token_id
    sampled0 = [*pieces(tokenizer, "hello"), eos]
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    context, _ = episode_tokens(episode_segments(tokenizer, history, None, [sampled0], generation=True))
    sampled1 = [*pieces(tokenizer, "bye"), eos]
    full, mask = episode_tokens(
        episode_segments(tokenizer, [*history, {"role": "assistant", "content": "bye"}], None, [sampled0, sampled1])
    )
    assert full == context + sampled1
    assert mask[len(context) :] == [1] * len(sampled1)
    assert tokenizer.decode(context).endswith("<|im_start|>assistant\n")


def test_a_turn_cut_by_the_budget_gets_its_end_of_turn_as_context(tokenizer):
    eos = tokenizer.eos_token_id
    cut = pieces(tokenizer, "I will wri")  # no end-of-turn token: the token budget ended it
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "I will wri"},
        {"role": "user", "content": "continue"},
        {"role": "assistant", "content": "ok"},
    ]
    sampled = [cut, [*pieces(tokenizer, "ok"), eos]]
    segments = episode_segments(tokenizer, messages, None, sampled)
    assert [trained for _, trained in segments] == [False, True, False, True]
    between = segments[2][0]
    assert between[0] == eos and tokenizer.decode(between).startswith("<|im_end|>\n<|im_start|>user\ncontinue")
    _ids, mask = episode_tokens(segments)
    assert sum(mask) == len(cut) + len(sampled[1])


def test_turns_and_sampled_ids_must_agree(tokenizer):
    with pytest.raises(ValueError, match="2 assistant messages but 1 sampled"):
        episode_segments(
            tokenizer,
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "assistant", "content": "c"},
            ],
            None,
            [[1]],
        )


def test_assistant_turns_of_a_worked_example_are_context(tokenizer):
    eos = tokenizer.eos_token_id
    opening = [
        {"role": "user", "content": "example question"},
        {"role": "assistant", "content": "example answer"},
        {"role": "user", "content": "real question"},
    ]
    sampled = [*pieces(tokenizer, "real answer"), eos]
    messages = [*opening, {"role": "assistant", "content": "real answer"}]
    segments = episode_segments(tokenizer, messages, None, [sampled], context_messages=len(opening))
    ids, mask = episode_tokens(segments)
    assert [t for t, m in zip(ids, mask, strict=True) if m] == sampled
    assert "example answer" in tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if not m])
    with pytest.raises(ValueError, match="2 assistant messages but 1 sampled"):
        episode_segments(tokenizer, messages, None, [sampled])
