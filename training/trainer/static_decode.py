"""A decode loop whose tensors keep their shapes from token to token, for CUDA graphs.

`static_decode_from` continues a `sampling.prefill` as `sampling.decode_from` does (same
arguments, same draws), but the per-token forward never changes shape: the prefill's
key/value cache is copied once into a preallocated `transformers.StaticCache` of
P + max_new_tokens slots, the attention mask is allocated at that full width (B, P +
max_new_tokens) with one column switched on per token, and positions advance in place.
The eager loop grows its mask and cache every token, so on a GPU a small model spends
most of a token launching its few hundred kernels one by one; a fixed-shape step can be
captured once as a CUDA graph (`torch.compile(mode="reduce-overhead")`) and replayed.

Where a new token's key and value go: transformers 5 models take no `cache_position`.
Each StaticCache layer keeps its write offset as a 0-d tensor (`cumulative_length`) that
it advances in place and that the causal mask reads, so the step needs no Python number
that changes per token. Slots past the offset are masked, causally and by the mask's
zeros, so the padding a static cache adds changes no score. It changes the order of
the sums over them, though: a float32 logit can differ from the eager loop's by ~1e-6,
which flips a draw only when its uniform number lands that close to a boundary between
two tokens: never in the tests (float64 tiny models); in one run of a random fp32
SmolLM2-135M, whose flat distribution over 49k tokens packs boundaries tightly, 2 rows of
16 parted from the eager loop's within 32 tokens.

Sampling (temperature, nucleus, one inverse-CDF draw per row from the per-context
generators) is `sampling.next_tokens`, the eager loop's own, run outside the captured step.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence

import torch

from training.trainer.sampling import next_tokens
from training.trainer.sharding import lockstep

# With compile=True the cache is rounded up to a multiple of this many slots and kept for
# the next call with the same model and batch: prompts of a job differ in length from
# step to step, and a captured graph is replayed only on the buffers it was recorded with
# (new addresses make torch re-record, and it gives up after a limit).
COMPILED_LENGTH_STEP = 256
_held_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model → its StaticCache


@torch.no_grad()
def static_decode_from(
    model,
    logits: torch.Tensor,
    cache,
    mask: torch.Tensor,
    next_position: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    eos_ids: Sequence[int],
    pad_id: int,
    generators: Sequence[torch.Generator] | None = None,
    compile: bool = False,
) -> torch.Tensor:
    """`sampling.decode_from` with fixed-shape steps: the same arguments, the same
    (B, T ≤ max_new_tokens) result with rows that ended padded with `pad_id`, the same
    draws from `generators`, and the same tokens up to float rounding (module docstring).
    `cache` (the prefill's DynamicCache) is read, not extended.

    compile=True wraps the one-token forward in `torch.compile(mode="reduce-overhead",
    fullgraph=False)`, which records it as CUDA graphs and replays them. It is refused
    (ValueError) for a model that is not on a CUDA device: what it gains is the launches
    a CUDA graph saves, and CPU tensors have no CUDA graphs, so it would only add a
    compile (minutes, and a C++ toolchain) to an eager-speed loop. Compiled kernels round
    differently from eager ones too. The compiled path keeps its StaticCache, rounded up
    to COMPILED_LENGTH_STEP slots, for the next call on the same model (0.35 GiB for
    SmolLM2-135M in bf16 at 64 rows of 256 slots).

    A model sharded over processes is refused (ValueError): its passes are collectives
    that `decode_from` keeps in lockstep, and this loop does not."""
    batch, prompt = mask.shape
    device = mask.device
    if compile and device.type != "cuda":
        raise ValueError(
            "compile=True needs a CUDA model: it saves kernel launches by replaying the step as CUDA graphs, "
            f"which {device.type} tensors do not have (run with compile=False)"
        )
    if lockstep(model) is not None:
        raise ValueError(
            "a model sharded over processes decodes with sampling.decode_from, which keeps them in lockstep"
        )
    if max_new_tokens <= 0:
        return torch.empty((batch, 0), dtype=torch.long, device=device)
    length = prompt + max_new_tokens
    if compile:
        length = -(-length // COMPILED_LENGTH_STEP) * COMPILED_LENGTH_STEP
    static = static_cache_from(model, cache, length=length, reuse=_held_caches.get(model) if compile else None)
    if compile:
        _held_caches[model] = static
        step = _compiled_forward()
    else:
        step = _forward_one
    full_mask = torch.zeros((batch, length), dtype=mask.dtype, device=device)  # (B, L), a column switched on per token
    full_mask[:, :prompt] = mask
    position = next_position.clone()  # (B, 1), advanced in place
    eos = torch.tensor(list(eos_ids), device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens: list[torch.Tensor] = []
    for column in range(prompt, prompt + max_new_tokens):
        chosen = next_tokens(
            logits, finished, temperature=temperature, top_p=top_p, generators=generators, pad_id=pad_id
        )
        tokens.append(chosen)
        finished |= torch.isin(chosen, eos)
        if bool(finished.all()) or len(tokens) == max_new_tokens:
            break
        full_mask[:, column] = 1
        if compile:
            torch.compiler.cudagraph_mark_step_begin()
        logits = step(model, static, chosen.unsqueeze(1), position, full_mask)
        position += 1
    return torch.stack(tokens, dim=1)


def _forward_one(model, cache, token: torch.Tensor, position: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """One token per row through the model: (B, 1) ids and positions, the (B, L) mask →
    the next logits (B, V). Writes the token's keys and values at the cache's offset."""
    out = model(input_ids=token, attention_mask=mask, position_ids=position, past_key_values=cache, use_cache=True)
    return out.logits[:, -1, :]


@functools.cache
def _compiled_forward():
    return torch.compile(_forward_one, mode="reduce-overhead", fullgraph=False)


def static_cache_from(model, cache, *, length: int, reuse=None):
    """A `transformers.StaticCache` of `length` slots holding the P positions of `cache`
    (a prefill's DynamicCache) in slots 0…P-1, its write offset at P. `reuse`: a
    StaticCache to overwrite when its buffers have the right shape (else a new one).

    Only caches of full-attention layers are copied: a sliding-window or linear-attention
    layer keeps a different state, and is refused (ValueError)."""
    from transformers import StaticCache
    from transformers.cache_utils import DynamicLayer, StaticLayer

    sources = list(cache.layers)
    kinds = {type(layer).__name__ for layer in sources if type(layer) is not DynamicLayer}
    if kinds:
        raise ValueError(f"a static cache copies full-attention layers only, not {', '.join(sorted(kinds))}")
    prompt = sources[0].keys.shape[2]
    if length < prompt:
        raise ValueError(f"{length} cache slots cannot hold a {prompt}-token prefill")

    def fits(static) -> bool:  # same layers, batch, heads, head size, dtype and device; `length` slots
        return len(static.layers) == len(sources) and all(
            target.is_initialized
            and target.keys.shape == (*source.keys.shape[:2], length, source.keys.shape[3])
            and target.values.shape == (*source.values.shape[:2], length, source.values.shape[3])
            and (target.keys.dtype, target.keys.device) == (source.keys.dtype, source.keys.device)
            for source, target in zip(sources, static.layers, strict=True)
        )

    static = reuse if reuse is not None and fits(reuse) else StaticCache(config=model.config, max_cache_len=length)
    if len(static.layers) != len(sources) or any(type(layer) is not StaticLayer for layer in static.layers):
        found = sorted({type(layer).__name__ for layer in static.layers})
        raise ValueError(
            f"the model's static cache has {len(static.layers)} layers ({', '.join(found)}), "
            f"the prefill's {len(sources)} full-attention ones"
        )
    for source, target in zip(sources, static.layers, strict=True):
        if not target.is_initialized:
            target.lazy_initialization(source.keys, source.values)  # allocates (B, H, length, D) zeros
        target.keys[:, :, :prompt].copy_(source.keys)
        target.values[:, :, :prompt].copy_(source.values)
        target.keys[:, :, prompt:].zero_()
        target.values[:, :, prompt:].zero_()
        target.cumulative_length.fill_(prompt)
    return static
