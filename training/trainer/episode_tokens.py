"""The tokens of a multi-turn episode and the mask over the model's own tokens.

An episode alternates context the model reads (system prompt, task, tool results, the
chat template's headers) with tokens the model sampled. The policy is trained on the
sampled tokens only, exactly as they were sampled (never re-tokenised from the parsed
tool calls), and generation at turn k reads exactly the tokens training will see:

    ids  = c_0 ‖ s_0 ‖ c_1 ‖ s_1 ‖ … ‖ c_k ‖ s_k
    mask =  0…0 ‖ 1…1 ‖ 0…0 ‖ 1…1 ‖ … ‖ 0…0 ‖ 1…1

where c_j is the context the template adds before assistant turn j (for j > 0: the end
of the previous turn after its end-of-turn token, the tool results, the next assistant
header) and s_j the ids sampled at turn j, end-of-turn token included when sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Segment = tuple[list[int], bool]  # (token ids, trained?)


def episode_tokens(segments: Sequence[Segment]) -> tuple[list[int], list[int]]:
    """Concatenate segments into (input_ids, assistant_mask): mask[t] = 1 exactly where
    token t belongs to a segment marked trained (a model-sampled turn), else 0."""
    ids: list[int] = []
    mask: list[int] = []
    for tokens, trained in segments:
        ids += list(tokens)
        mask += [1 if trained else 0] * len(tokens)
    return ids, mask


def _render(tokenizer, messages: list[dict[str, Any]], tools, *, generation: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools or None, tokenize=False, add_generation_prompt=generation
    )


def _assistant_positions(messages: list[dict[str, Any]], start: int) -> list[int]:
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i >= start]


def episode_segments(
    tokenizer,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    sampled: Sequence[Sequence[int]],
    *,
    generation: bool = False,
    context_messages: int = 0,
) -> list[Segment]:
    """Segments of an episode whose assistant turns were sampled as `sampled` (one id list
    per assistant message, in order). With `generation=True` a last context segment is
    added: the context for the next turn, ending with the assistant header.

    Context text comes from the chat template: c_0 is the rendering of the messages
    before the first assistant turn plus the assistant header; c_j is what the template
    adds after the end-of-turn token of turn j-1 up to the next assistant header. When a
    sampled turn did not end with the end-of-turn token (cut by the token budget), c_j
    starts with it, as context.

    The first `context_messages` messages are the task's opening (system prompt, worked
    examples, the prompt): assistant messages among them are context, not sampled."""
    positions = _assistant_positions(messages, context_messages)
    if len(positions) != len(sampled):
        raise ValueError(f"{len(positions)} assistant messages but {len(sampled)} sampled turns")
    eos_text = tokenizer.eos_token
    eos_id = tokenizer.eos_token_id
    segments: list[Segment] = []
    done = ""  # template text already covered, up to the end of the last sampled turn
    after_eos = ""  # what the template writes after an assistant turn's end-of-turn token
    ends = [*positions, len(messages)]
    for k, end in enumerate(ends):
        last = k == len(positions)
        if last and not generation:
            break
        header = _render(tokenizer, messages[:end], tools, generation=True)
        if k == 0:
            text = header
        else:
            if not header.startswith(done):
                raise ValueError("the chat template does not render a conversation as a prefix of its continuation")
            tail = after_eos if sampled[k - 1] and sampled[k - 1][-1] == eos_id else eos_text + after_eos
            text = tail + header[len(done) :]
        segments.append((tokenizer(text, add_special_tokens=False)["input_ids"], False))
        if last:
            break
        segments.append((list(sampled[k]), True))
        done = _render(tokenizer, messages[: end + 1], tools, generation=False)
        cut = done.rfind(eos_text)
        after_eos = done[cut + len(eos_text) :] if cut >= 0 else ""
    return segments


def episode_values(segments: Sequence[Segment], per_turn: Sequence[Sequence[float]]) -> list[float]:
    """One value per token of `episode_tokens(segments)`: turn k's values (e.g. the
    sampler's log-prob of each id it drew) on the k-th trained segment, 0.0 on context
    tokens."""
    turns = iter(per_turn)
    values: list[float] = []
    for tokens, trained in segments:
        if trained:
            turn = list(next(turns))
            if len(turn) != len(tokens):
                raise ValueError(f"{len(turn)} values for a sampled turn of {len(tokens)} tokens")
            values += turn
        else:
            values += [0.0] * len(tokens)
    return values
