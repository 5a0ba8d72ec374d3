"""The fixed-shape decode loop draws the same tokens as the eager one, on tiny random models."""

from __future__ import annotations

import pytest
import torch

from training.trainer.sampling import common_prefix_length, decode_from, prefill
from training.trainer.static_decode import static_cache_from, static_decode_from

# A shared prefix, then remainders of different lengths: prefill shares the prefix and
# left-pads the remainders; the duplicate context is prefilled once for both.
CONTEXTS = [
    [7, 8, 9, 10, 11, 12, 13, 40, 41],
    [7, 8, 9, 10, 11, 12, 13, 50],
    [7, 8, 9, 10, 11, 12, 13, 60, 61, 62, 63, 64, 65],
    [7, 8, 9, 10, 11, 12, 13, 40, 41],
]
COPIES = 3
PAD = 0


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request):
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    torch.set_num_threads(1)
    config_class = Qwen2Config if request.param == "qwen2" else LlamaConfig
    config = config_class(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=256,
        # Untied and with larger weights than the default init, so that greedy decoding
        # neither echoes the last token nor chooses between near-ties.
        tie_word_embeddings=False,
        initializer_range=0.2,
    )
    torch.manual_seed(0)
    # float64: attention over the static cache's full width sums in another order than over
    # the slots written so far, which moves a float32 logit by ~1e-6 and, rarely, a draw
    # that lands that close to a boundary. In float64 the difference (if any) is far below
    # what survives the sampler's cast to float32, so the tokens agree on any machine.
    return AutoModelForCausalLM.from_config(config, dtype=torch.float64).eval()


def both(model, *, seeds=None, **options) -> tuple[torch.Tensor, torch.Tensor]:
    """(decode_from's tokens, static_decode_from's), each after its own prefill of CONTEXTS
    and with its own generators seeded alike."""
    results = []
    for decode in (decode_from, static_decode_from):
        generators = None if seeds is None else [torch.Generator().manual_seed(s) for s in seeds]
        logits, cache, mask, position = prefill(model, CONTEXTS, copies=COPIES, pad_id=PAD)
        results.append(decode(model, logits, cache, mask, position, pad_id=PAD, generators=generators, **options))
    return results[0], results[1]


def test_the_contexts_share_a_prefix_and_differ_in_length():
    assert common_prefix_length(CONTEXTS) == 7
    assert len({len(c) for c in CONTEXTS}) == 3


def test_greedy_tokens_are_those_of_the_eager_loop(model):
    eager, static = both(model, max_new_tokens=24, temperature=0, top_p=1.0, eos_ids=[-1])
    assert eager.shape == (len(CONTEXTS) * COPIES, 24)
    assert torch.equal(static, eager)


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.8)])
def test_sampled_tokens_are_those_of_the_eager_loop_with_the_same_generators(model, temperature, top_p):
    options = {"max_new_tokens": 24, "temperature": temperature, "top_p": top_p, "eos_ids": [-1]}
    eager, static = both(model, seeds=[11, 12, 13, 14], **options)
    assert torch.equal(static, eager)
    # The copies of a context were sampled, not repeated: they differ.
    assert not torch.equal(eager[0], eager[1])
    # The duplicate context (rows 9-11) draws from its own generator, so it differs from the first.
    assert not torch.equal(eager[:COPIES], eager[3 * COPIES :])


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_rows_that_end_at_different_steps_are_padded_alike(model, temperature):
    """End tokens picked from a run without any, one per row at steps 1…14, so that rows
    end at different steps and all before max_new_tokens: both loops pad each row after
    its end and stop together."""
    options = {"seeds": [1, 2, 3, 4], "max_new_tokens": 16, "temperature": temperature, "top_p": 1.0}
    free, _ = both(model, eos_ids=[-1], **options)
    ends = sorted({int(free[row, 1 + row * 5 % 14]) for row in range(free.shape[0])})
    eager, static = both(model, eos_ids=ends, **options)
    assert torch.equal(static, eager)
    is_end = torch.isin(eager, torch.tensor(ends))  # (B, T)
    first_end = is_end.long().argmax(dim=1)  # (B,)
    assert is_end.any(dim=1).all() and len(set(first_end.tolist())) > 2
    assert eager.shape[1] == int(first_end.max()) + 1 < 16  # stopped when the last row ended
    after = torch.arange(eager.shape[1]) > first_end.unsqueeze(1)  # (B, T)
    assert after.any() and (eager[after] == PAD).all()


@pytest.mark.parametrize("temperature", [0, 1.0])
def test_one_new_token_and_none(model, temperature):
    eager, static = both(model, seeds=[1, 2, 3, 4], max_new_tokens=1, temperature=temperature, top_p=1.0, eos_ids=[2])
    assert static.shape == (len(CONTEXTS) * COPIES, 1) and torch.equal(static, eager)
    eager, static = both(model, max_new_tokens=0, temperature=temperature, top_p=1.0, eos_ids=[2])
    assert static.shape == eager.shape == (len(CONTEXTS) * COPIES, 0)


def test_the_prefill_cache_is_copied_not_extended_and_a_reused_cache_is_overwritten(model):
    logits, cache, mask, position = prefill(model, CONTEXTS, copies=COPIES, pad_id=PAD)
    prompt = mask.shape[1]
    keys = cache.layers[0].keys.clone()
    static_decode_from(
        model, logits, cache, mask, position, max_new_tokens=8, temperature=0, top_p=1.0, eos_ids=[-1], pad_id=PAD
    )
    assert cache.get_seq_length() == prompt and torch.equal(cache.layers[0].keys, keys)

    static = static_cache_from(model, cache, length=prompt + 8)
    static.layers[0].keys.fill_(1.0)  # stale keys from an earlier call
    static.layers[0].cumulative_length.fill_(prompt + 5)
    again = static_cache_from(model, cache, length=prompt + 8, reuse=static)
    assert again is static
    layer = again.layers[0]
    assert torch.equal(layer.keys[:, :, :prompt], keys) and not layer.keys[:, :, prompt:].any()
    assert int(layer.cumulative_length) == prompt
    # Another length needs other buffers.
    assert static_cache_from(model, cache, length=prompt + 9, reuse=static) is not static


def test_compile_is_refused_on_cpu(model):
    logits, cache, mask, position = prefill(model, CONTEXTS[:1], pad_id=PAD)
    with pytest.raises(ValueError, match="needs a CUDA model"):
        static_decode_from(
            model,
            logits,
            cache,
            mask,
            position,
            max_new_tokens=4,
            temperature=0,
            top_p=1.0,
            eos_ids=[-1],
            pad_id=PAD,
            compile=True,
        )
