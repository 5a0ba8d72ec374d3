"""Batched sampling and per-token log-probs on the tiny model."""

from __future__ import annotations

import pytest
import torch

from training.grpo.sampling import (
    chat_tokens,
    encode_prompt,
    left_pad,
    response_mask_from_ids,
    sample,
    token_logprobs,
)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval(), AutoTokenizer.from_pretrained(tiny_model_dir)


def test_left_pad_and_response_mask_by_hand():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    response = torch.tensor([[4, 2, 9, 2], [4, 4, 4, 4], [2, 7, 7, 7]])
    m, truncated = response_mask_from_ids(response, eos_ids=[2])
    assert m.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


def test_left_padded_logprobs_equal_those_of_the_unpadded_sequence(tiny):
    model, _ = tiny
    short = [11, 12, 13, 14, 15]
    long = [21, 22, 23, 24, 25, 26, 27, 28]
    ids, attn = left_pad([short, long], pad_id=0)
    with torch.no_grad():
        batched = token_logprobs(model, ids, attn, keep=3)
        alone = token_logprobs(model, torch.tensor([short]), torch.ones(1, 5, dtype=torch.long), keep=3)
    assert torch.allclose(batched[0], alone[0], atol=1e-5)


def test_sample_returns_groups_with_masks_that_stop_at_the_end_of_turn(tiny):
    model, tokenizer = tiny
    torch.manual_seed(0)
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": q}]) for q in ("hello", "refund order A1 please")]
    rollout = sample(model, tokenizer, prompts, num_samples=3, max_new_tokens=6)
    assert rollout.input_ids.shape[0] == 6 and len(rollout.texts) == 6
    assert rollout.response_ids.shape == rollout.response_mask.shape
    eos = tokenizer.eos_token_id
    for row in range(6):
        tokens = rollout.response_ids[row][rollout.response_mask[row].bool()].tolist()
        assert eos not in tokens[:-1]  # nothing trained after the end of turn
        assert rollout.truncated[row] == (not tokens or tokens[-1] != eos)
    # Prompt padding is masked out; responses come right after each prompt.
    assert rollout.attention_mask[:3, : rollout.prompt_length].sum(dim=1).tolist() == [len(prompts[0])] * 3


def test_chat_tokens_mask_every_assistant_span(tiny):
    _, tokenizer = tiny
    messages = [
        {"role": "user", "content": "where is order A1"},
        {"role": "assistant", "content": "shipped"},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "yes"},
    ]
    ids, mask = chat_tokens(tokenizer, messages)
    assert len(ids) == len(mask)
    whole = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(ids) == whole
    trained = tokenizer.decode([t for t, m in zip(ids, mask, strict=True) if m])
    assert trained.replace("\n", "") == "shipped<|im_end|>yes<|im_end|>"


def test_the_decode_loop_matches_generate_greedily_and_with_padding(tiny):
    model, tokenizer = tiny
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": q}]) for q in ("hi", "where is my order A1?")]
    ours = sample(model, tokenizer, prompts, num_samples=1, max_new_tokens=8, temperature=0)
    theirs = sample(model, tokenizer, prompts, num_samples=1, max_new_tokens=8, temperature=0, engine="generate")
    width = min(ours.response_ids.shape[1], theirs.response_ids.shape[1])
    mask = ours.response_mask[:, :width].bool()
    assert torch.equal(ours.response_ids[:, :width][mask], theirs.response_ids[:, :width][mask])
    assert ours.texts == theirs.texts


def test_nucleus_keeps_the_top_mass():
    from training.grpo.sampling import _nucleus

    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = _nucleus(probs, 0.75)  # 0.5 + 0.3 reach 0.75: the rest is dropped
    assert kept.tolist()[0] == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])


def test_the_decode_loop_samples_from_the_softmax(tiny):
    """Frequencies of the first sampled token match softmax(logits / T) on the top tokens."""
    from training.grpo.sampling import decode, position_ids

    model, tokenizer = tiny
    prompt = encode_prompt(tokenizer, [{"role": "user", "content": "hello"}])
    ids = torch.tensor([prompt] * 4000)
    attn = torch.ones_like(ids)
    with torch.no_grad():
        logits = model(input_ids=ids[:1], attention_mask=attn[:1], position_ids=position_ids(attn[:1])).logits[0, -1]
    # At T = 0.2 the random model's flat distribution has a clear top token.
    expected = torch.softmax(logits / 0.2, dim=-1)
    assert 0.1 < expected.max() < 0.5  # a 1.3x wrong temperature would move it by ~0.1
    torch.manual_seed(3)
    first = decode(model, ids, attn, max_new_tokens=1, temperature=0.2, top_p=1.0, eos_ids=[-1], pad_id=0)[:, 0]
    observed = torch.bincount(first, minlength=expected.numel()).float() / len(first)
    top = expected.argsort(descending=True)[:10]
    assert (observed[top] - expected[top]).abs().max() < 0.03


def test_inverse_cdf_draws_match_the_probabilities_and_never_pick_a_zero():
    from training.grpo.sampling import _inverse_cdf

    torch.manual_seed(0)
    probs = torch.tensor([[0.7, 0.2, 0.0, 0.1]]).repeat(20000, 1)
    counts = torch.bincount(_inverse_cdf(probs), minlength=4).float() / 20000
    assert counts.tolist() == pytest.approx([0.7, 0.2, 0.0, 0.1], abs=0.015)
    assert counts[2] == 0


def test_a_sample_without_its_token_ids_or_log_probs_is_refused():
    from training.grpo.vllm_rollout import VllmError, sampled_tokens

    choice = {"index": 0, "text": "yes 12", "logprobs": {"token_logprobs": [-0.1, -0.2]}}
    with pytest.raises(VllmError, match="no token_ids"):
        sampled_tokens(choice)
    with pytest.raises(VllmError, match="1 log-probs for 2 sampled ids"):
        sampled_tokens(choice | {"token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.1]}})
    assert sampled_tokens(choice | {"token_ids": [5, 6]}) == ([5, 6], [-0.1, -0.2])
