"""Batched sampling and per-token log-probs on the tiny model."""

from __future__ import annotations

import pytest
import torch

from training.trainer.logprobs import token_logprobs
from training.trainer.sampling import (
    chat_tokens,
    common_prefix_length,
    encode_prompt,
    left_pad,
    prefix_decode,
    response_mask_from_ids,
    sample,
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
    from training.trainer.sampling import _nucleus

    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = _nucleus(probs, 0.75)  # 0.5 + 0.3 reach 0.75: the rest is dropped
    assert kept.tolist()[0] == pytest.approx([0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0])


@pytest.mark.parametrize("top_p", [1.0, 0.2])
def test_the_decode_loop_samples_from_the_softmax(tiny, top_p):
    """Frequencies of the first sampled token of one prompt copied to 4000 rows match
    softmax(logits / T), cut to the nucleus and renormalised when top_p < 1."""
    model, tokenizer = tiny
    prompt = encode_prompt(tokenizer, [{"role": "user", "content": "hello"}])
    ids = torch.tensor([prompt])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
    # At T = 0.2 the random model's flat distribution has a clear top token.
    expected = torch.softmax(logits / 0.2, dim=-1)
    assert 0.1 < expected.max() < 0.5  # a 1.3x wrong temperature would move it by ~0.1
    if top_p < 1.0:  # by hand: the most likely tokens until their mass reaches top_p
        order = expected.argsort(descending=True)
        before = expected[order].cumsum(0) - expected[order]
        kept = order[before < top_p]
        assert 2 <= len(kept) < 10
        nucleus = torch.zeros_like(expected)
        nucleus[kept] = expected[kept]
        expected = nucleus / nucleus.sum()
    torch.manual_seed(3)
    first = prefix_decode(
        model, [prompt], copies=4000, max_new_tokens=1, temperature=0.2, top_p=top_p, eos_ids=[-1], pad_id=0
    )[:, 0]
    observed = torch.bincount(first, minlength=expected.numel()).float() / len(first)
    top = expected.argsort(descending=True)[:10]
    assert (observed[top] - expected[top]).abs().max() < 0.03
    assert observed[expected == 0].sum() == 0  # nothing outside the nucleus


def test_inverse_cdf_draws_match_the_probabilities_and_never_pick_a_zero():
    from training.trainer.sampling import _inverse_cdf

    torch.manual_seed(0)
    probs = torch.tensor([[0.7, 0.2, 0.0, 0.1]]).repeat(20000, 1)
    counts = torch.bincount(_inverse_cdf(probs), minlength=4).float() / 20000
    assert counts.tolist() == pytest.approx([0.7, 0.2, 0.0, 0.1], abs=0.015)
    assert counts[2] == 0


def test_a_sample_without_its_token_ids_or_log_probs_is_refused():
    from training.trainer.vllm_rollout import VllmError, sampled_tokens

    choice = {"index": 0, "text": "yes 12", "logprobs": {"token_logprobs": [-0.1, -0.2]}}
    with pytest.raises(VllmError, match="no token_ids"):
        sampled_tokens(choice)
    with pytest.raises(VllmError, match="1 log-probs for 2 sampled ids"):
        sampled_tokens(choice | {"token_ids": [5, 6], "logprobs": {"token_logprobs": [-0.1]}})
    assert sampled_tokens(choice | {"token_ids": [5, 6]}) == ([5, 6], [-0.1, -0.2])


# --- one prefill per distinct prompt ---------------------------------------------------------

SYSTEM = {"role": "system", "content": "You answer questions about orders. " * 4}


def prompt_sets(tokenizer) -> dict[str, list[list[int]]]:
    def enc(*messages):
        return encode_prompt(tokenizer, list(messages))

    return {
        # A long shared system prompt, questions of different lengths: prefix + remainders.
        "shared system prompt": [
            enc(SYSTEM, {"role": "user", "content": q})
            for q in ("hi", "where is order A1 please tell me", "refund order A1 now")
        ],
        # One prompt: its G rows are copies of one prefill.
        "one prompt": [enc(SYSTEM, {"role": "user", "content": "where is order A7"})],
        # No system prompt, a prompt twice: the duplicate is prefilled once too.
        "duplicates": [
            enc({"role": "user", "content": "refund order A1 please"}),
            enc({"role": "user", "content": "hi"}),
            enc({"role": "user", "content": "refund order A1 please"}),
        ],
    }


def plain_sample(model, tokenizer, prompts, *, num_samples, max_new_tokens, temperature, top_p):
    """The sampler without sharing: every row's prompt prefilled in full."""
    eos = [tokenizer.eos_token_id]
    response = prefix_decode(
        model,
        prompts,
        copies=num_samples,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        eos_ids=eos,
        pad_id=tokenizer.pad_token_id,
        share_prefix=False,
    )
    mask, _ = response_mask_from_ids(response, eos)
    return torch.where(mask.bool(), response, torch.full_like(response, tokenizer.pad_token_id))


@pytest.mark.parametrize("case", ["shared system prompt", "one prompt", "duplicates"])
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_sharing_the_prefill_draws_the_same_tokens_as_prefilling_every_row(tiny, case, temperature, top_p):
    """Same seed, same tokens: the shared prefill changes the work done, not the samples."""
    model, tokenizer = tiny
    prompts = prompt_sets(tokenizer)[case]
    options = {"num_samples": 4, "max_new_tokens": 10, "temperature": temperature, "top_p": top_p}
    torch.manual_seed(11)
    rollout = sample(model, tokenizer, prompts, **options)
    torch.manual_seed(11)
    plain = plain_sample(model, tokenizer, prompts, **options)
    assert torch.equal(rollout.response_ids, plain)
    # Rows differ within a group (they are samples, not copies of one).
    assert len({tuple(r) for r in rollout.response_ids[:4].tolist()}) > 1


def test_the_log_probs_the_sampler_used_are_those_of_a_full_forward_pass(tiny):
    """The logits each token was drawn from (read off the model's outputs during
    sampling) give, for every sampled token, the log-prob that `token_logprobs` computes
    on the finished rollout in one pass: the shared prefix, the copied cache and the left
    padding between prompts of different lengths change nothing the update sees."""
    model, tokenizer = tiny
    prompts = prompt_sets(tokenizer)["shared system prompt"]
    assert common_prefix_length(prompts) > 30 and len({len(p) for p in prompts}) == 3
    group, temperature = 4, 0.7
    seen: list[torch.Tensor] = []
    hook = model.register_forward_hook(lambda _m, _i, out: seen.append(out.logits[:, -1, :].clone()))
    try:
        torch.manual_seed(5)
        rollout = sample(model, tokenizer, prompts, num_samples=group, max_new_tokens=8, temperature=temperature)
    finally:
        hook.remove()
    prefix, remainders, *steps = seen
    assert prefix.shape[0] == 1 and remainders.shape[0] == len(prompts)  # each prompt prefilled once
    used = torch.stack([remainders.repeat_interleave(group, dim=0), *steps], dim=1)  # (B, T, V)
    width = rollout.response_ids.shape[1]
    sampler = torch.log_softmax(used[:, :width] / temperature, dim=-1)
    sampler = sampler.gather(-1, rollout.response_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    with torch.no_grad():
        fresh = token_logprobs(model, rollout.input_ids, rollout.attention_mask, keep=width, temperature=temperature)
    mask = rollout.response_mask.bool()
    assert torch.allclose(sampler[mask], fresh[mask], atol=1e-5)
    # The layout: each prompt left-padded to P, with the response right after it.
    for row in range(len(rollout.texts)):
        prompt = prompts[row // group]
        P = rollout.prompt_length
        assert rollout.input_ids[row, P - len(prompt) : P].tolist() == prompt
        assert rollout.attention_mask[row, :P].tolist() == [0] * (P - len(prompt)) + [1] * len(prompt)


def test_end_tokens_stop_rows_and_the_rest_are_truncated(tiny):
    """Given an end token that some rows sample and others do not, the rows that sample it
    end there (mask through it, padding after it, not truncated) and the others run to
    max_new_tokens and are marked truncated; the tokens before the end are the ones drawn
    without that end token (the draws do not depend on which rows have ended)."""
    model, tokenizer = tiny
    prompts = prompt_sets(tokenizer)["shared system prompt"]
    options = {"num_samples": 2, "max_new_tokens": 8, "temperature": 1.0, "top_p": 1.0}
    torch.manual_seed(2)
    free = plain_sample(model, tokenizer, prompts, **options).tolist()
    stop = next(t for t in free[0][1:6] if t not in free[0][:1] and any(t not in row for row in free))
    expected = [row.index(stop) + 1 if stop in row else 8 for row in free]
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, stop]
    try:
        torch.manual_seed(2)
        rollout = sample(model, tokenizer, prompts, **options)
    finally:
        model.generation_config.eos_token_id = saved
    P, width, pad = rollout.prompt_length, rollout.response_ids.shape[1], tokenizer.pad_token_id
    assert width == max(expected) == 8
    for row, length in enumerate(expected):
        assert rollout.response_mask[row].tolist() == [1] * length + [0] * (width - length)
        assert rollout.response_ids[row, :length].tolist() == free[row][:length]
        assert rollout.response_ids[row, length:].tolist() == [pad] * (width - length)
        assert rollout.attention_mask[row, P:].tolist() == rollout.response_mask[row].tolist()
        assert rollout.truncated[row] == (stop not in free[row])
    assert 1 <= sum(rollout.truncated) < len(expected)


# --- a group's prompt through the model once, in the update ----------------------------------


def test_rows_that_share_a_prompt_send_it_through_once_with_the_same_values_and_gradients(tiny_model_dir):
    """GRPO's update scores G samples of each prompt: `token_logprobs` takes each distinct
    prompt through the model once and the responses on its copied cache. The log-probs and
    the gradient they give are those of one pass over every full row, with left padding
    between prompts of different lengths."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.trainer.logprobs import forward_logits, gather_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = prompt_sets(tokenizer)["shared system prompt"]
    torch.manual_seed(3)
    rollout = sample(model.eval(), tokenizer, prompts, num_samples=4, max_new_tokens=8, temperature=1.0)
    model.train()
    ids, attn, width = rollout.input_ids, rollout.attention_mask, rollout.response_ids.shape[1]
    mask = rollout.response_mask.float()
    weights = torch.linspace(-1.0, 1.0, ids.shape[0]).unsqueeze(1)  # advantages of both signs

    def scored(logprobs_of):
        model.zero_grad(set_to_none=True)
        logprobs = logprobs_of()
        (logprobs * mask * weights).sum().backward()
        return logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    batches: list[int] = []
    hook = model.register_forward_hook(
        lambda _m, args, kwargs, _out: batches.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        shared, shared_grads = scored(lambda: token_logprobs(model, ids, attn, keep=width, temperature=0.7))
    finally:
        hook.remove()
    single, single_grads = scored(
        lambda: gather_logprobs(forward_logits(model, ids, attn, keep=width, temperature=0.7), ids[:, -width:])
    )
    assert batches == [len(prompts), ids.shape[0]]  # the prompts once, then every row's response
    on = rollout.response_mask.bool()
    assert torch.allclose(shared[on], single[on], atol=1e-5)
    for name, grad in single_grads.items():
        assert torch.allclose(shared_grads[name], grad, atol=1e-5, rtol=1e-4), name


def test_a_model_with_linear_attention_layers_takes_one_pass():
    """A hybrid model's cached state (linear attention, convolutions) is updated in place,
    which the gradient cannot go through: its rows take the single pass, and score as it does."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from training.trainer.logprobs import forward_logits, gather_logprobs, shared_prompt_logprobs

    config = Qwen3_5TextConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        pad_token_id=0,
        head_dim=32,
        layer_types=["linear_attention", "full_attention"],
        linear_num_value_heads=2,
        linear_num_key_heads=1,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
    )
    torch.manual_seed(0)
    model = Qwen3_5ForCausalLM(config).train()
    prompt = [5, 6, 7, 8]
    ids = torch.tensor([[*prompt, 10 + i, 20 + i, 30 + i] for i in range(4)])
    attn = torch.ones_like(ids)
    assert shared_prompt_logprobs(model, ids, attn, keep=3) is None
    single = gather_logprobs(forward_logits(model, ids, attn, keep=3), ids[:, -3:])
    scored = token_logprobs(model, ids, attn, keep=3)
    scored.sum().backward()
    assert torch.allclose(scored, single)


def test_rows_with_distinct_prompts_take_one_pass(tiny):
    from training.trainer.logprobs import shared_prompt_logprobs

    model, tokenizer = tiny
    prompts = prompt_sets(tokenizer)["shared system prompt"]
    rollout = sample(model, tokenizer, prompts, num_samples=1, max_new_tokens=4, temperature=1.0)
    width = rollout.response_ids.shape[1]
    with torch.no_grad():
        assert shared_prompt_logprobs(model, rollout.input_ids, rollout.attention_mask, keep=width) is None


def test_a_decode_cache_that_runs_out_of_room_grows_as_before(tiny):
    """The decode loop writes each new key/value into room reserved after the prefill;
    past that room the cache grows by concatenation, and the tokens are the same. After the
    loop the cache is transformers' own again: reordered and stepped, it stays consistent."""
    from training.trainer.decode_cache import cache_reserve
    from training.trainer.sampling import decode_from, prefill

    model, tokenizer = tiny
    prompts = prompt_sets(tokenizer)["duplicates"]
    pad = tokenizer.pad_token_id

    def greedy(room: int | None) -> torch.Tensor:
        with torch.no_grad():
            logits, cache, mask, position = prefill(model, prompts, copies=2, pad_id=pad)
            if room is not None:
                cache_reserve(cache, room)  # decode_from leaves an already reserved layer as it is
            out = decode_from(
                model,
                logits,
                cache,
                mask,
                position,
                max_new_tokens=9,
                temperature=0,
                top_p=1.0,
                eos_ids=[-1],
                pad_id=pad,
            )
            kinds = {type(layer).__name__ for layer in cache.layers}
        return out, kinds, cache.get_seq_length()

    full, kinds, length = greedy(None)
    short, _, short_length = greedy(2)
    # Handed back as transformers' own layers, holding what was written.
    assert kinds == {"DynamicLayer"} and full.shape[1] == 9
    assert torch.equal(short, full) and short_length == length


def test_a_cache_after_the_decode_loop_reorders_and_decodes_on(tiny):
    from training.trainer.sampling import decode_from, prefill

    model, tokenizer = tiny
    prompts = prompt_sets(tokenizer)["duplicates"]
    with torch.no_grad():
        logits, cache, mask, position = prefill(model, prompts, pad_id=tokenizer.pad_token_id)
        out = decode_from(
            model, logits, cache, mask, position, max_new_tokens=4, temperature=0, top_p=1.0, eos_ids=[-1], pad_id=0
        )
        keys = cache.layers[0].keys.clone()
        order = torch.tensor([2, 0, 1])
        cache.reorder_cache(order)
        assert torch.equal(cache.layers[0].keys, keys[order])
        model(input_ids=out[order, -1:], past_key_values=cache, use_cache=True)
    assert cache.get_seq_length() == keys.shape[-2] + 1


def test_grouped_query_attention_on_the_cpu_gives_the_logits_of_copied_heads(tiny, monkeypatch):
    """`cpu_grouped_attention` lets SDPA read the shared key/value heads itself under a
    padding mask (the tiny model has 2 query heads for 1 key/value head)."""
    import transformers.integrations.sdpa_attention as sdpa

    from training.trainer.policy import cpu_grouped_attention

    model, _ = tiny
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    ids, attn = left_pad([[11, 12, 13, 14, 15, 16], [21, 22, 23]], pad_id=0)
    monkeypatch.setattr(sdpa, "use_gqa_in_sdpa", lambda *args: False)
    with torch.no_grad():
        copied = model(input_ids=ids, attention_mask=attn).logits
    cpu_grouped_attention()
    assert sdpa.use_gqa_in_sdpa(attn, torch.zeros(1, 1, 2, 8), torch.zeros(1, 1, 2, 8)) is True
    with torch.no_grad():
        grouped = model(input_ids=ids, attention_mask=attn).logits
    assert torch.allclose(grouped[attn.bool()], copied[attn.bool()], atol=1e-5)


def test_the_decode_steps_four_d_padding_mask_draws_what_the_two_d_mask_draws(tiny, monkeypatch):
    """The decode loop hands SDPA the padding mask in 4-D (transformers then builds no mask
    of its own at each step): with prompts of three lengths, left-padded, the same seed
    draws the same tokens as with the 2-D mask transformers expands itself."""
    from training.trainer import sampling

    model, tokenizer = tiny
    prompts = prompt_sets(tokenizer)["shared system prompt"]
    assert len({len(p) for p in prompts}) == 3
    assert sampling._step_mask(model, torch.ones(2, 5, dtype=torch.long)).shape == (2, 1, 1, 5)
    options = {"num_samples": 4, "max_new_tokens": 12, "temperature": 1.0}
    torch.manual_seed(3)
    four_d = sample(model, tokenizer, prompts, **options)
    monkeypatch.setattr(sampling, "_step_mask", lambda _model, mask: mask)
    torch.manual_seed(3)
    two_d = sample(model, tokenizer, prompts, **options)
    assert torch.equal(four_d.response_ids, two_d.response_ids)
    assert torch.equal(four_d.response_mask, two_d.response_mask)
