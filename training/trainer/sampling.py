"""Sampling and per-token log-probs with a Hugging Face causal LM (plain or peft).

Layout of a batch: prompts are left-padded to a common length P and responses follow,
right-padded to T, so row b is `[pad… prompt_b | response_b pad…]`. Position ids come
from the attention mask, which makes left padding invisible to the model. The
log-probs used for the gradient are `logprobs.py`'s. Sampling
itself (`prefill`, `decode_from`) prefills each distinct prompt once, the prefix all
prompts share once for all, and copies the key/value cache to the prompt's G samples.

`chat_tokens` gives a whole conversation with a mask over *every* assistant span, for
multi-turn training where the mask covers several spans.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from training.trainer import sharding
from training.trainer.decode_cache import cache_reserve, cache_unreserve


@dataclass
class Rollout:
    """G samples for each of N prompts, in prompt-major order (row = n * G + g)."""

    input_ids: torch.Tensor  # (B, P + T) left-padded prompts, then responses
    attention_mask: torch.Tensor  # (B, P + T) prompt padding and post-EOS padding are 0
    response_mask: torch.Tensor  # (B, T) 1 on response tokens up to and including EOS
    prompt_length: int  # P
    texts: list[str]  # decoded responses, special tokens removed
    truncated: list[bool]  # no EOS within max_new_tokens

    @property
    def response_ids(self) -> torch.Tensor:  # (B, T)
        return self.input_ids[:, self.prompt_length :]

    @property
    def lengths(self) -> torch.Tensor:  # (B,)
        return self.response_mask.sum(dim=1)


def left_pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists → (ids (B, L), attention mask (B, L)), padded on the left."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(list(seq), dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids, mask


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """0, 1, 2… counted over real tokens only, so left padding does not shift positions."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)


def encode_prompt(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    """The chat template applied to a context, ending with the assistant header."""
    text = tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_target(tokenizer, response: str) -> list[int]:
    """A response's tokens as the model would emit them: the text, then end-of-turn."""
    return tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def chat_tokens(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> tuple[list[int], list[int]]:
    """A whole conversation's tokens and a 0/1 mask that is 1 on every assistant reply
    (its content, tool calls and end-of-turn token), 0 on everything else.

    Built segment by segment from growing prefixes of the rendered template, so each
    assistant span is exactly the text the template adds for that message."""
    ids: list[int] = []
    mask: list[int] = []
    rendered = ""
    for i, message in enumerate(messages):
        if message.get("role") == "assistant":
            header = tokenizer.apply_chat_template(
                messages[:i], tools=tools or None, tokenize=False, add_generation_prompt=True
            )
            piece = header[len(rendered) :]
            chunk = tokenizer(piece, add_special_tokens=False)["input_ids"]
            ids += chunk
            mask += [0] * len(chunk)
            rendered = header
        full = tokenizer.apply_chat_template(messages[: i + 1], tools=tools or None, tokenize=False)
        piece = full[len(rendered) :]
        chunk = tokenizer(piece, add_special_tokens=False)["input_ids"]
        train = 1 if message.get("role") == "assistant" else 0
        ids += chunk
        mask += [train] * len(chunk)
        rendered = full
    return ids, mask


def response_mask_from_ids(response_ids: torch.Tensor, eos_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) sampled tokens → (mask (B, T): 1 up to and including the first EOS,
    truncated (B,): True where no EOS appeared)."""
    is_eos = torch.zeros_like(response_ids, dtype=torch.bool)
    for eos in eos_ids:
        is_eos |= response_ids == eos
    # Tokens strictly after the first EOS: an EOS occurred at an earlier position.
    after = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0  # (B, T)
    return (~after).long(), ~is_eos.any(dim=1)


@torch.no_grad()
def sample(
    model,
    tokenizer,
    prompts: Sequence[Sequence[int]],
    *,
    num_samples: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    engine: str = "decode",
    generators: Sequence[torch.Generator] | None = None,
) -> Rollout:
    """Sample `num_samples` responses to each prompt (token lists).

    engine="decode" (default) runs `prefix_decode`: each distinct prompt goes through the
    model once (the prefix all prompts share, once for all) and its key/value cache is
    copied to its samples; engine="generate" uses transformers' `generate` on every row
    (same distribution, G prefills per prompt and more per-token overhead).
    temperature=0 is greedy. `generators` (one per prompt, CPU): each prompt's samples draw
    from its own stream, so they do not depend on which prompts share the batch (a
    data-parallel job's shards, `parallel.item_generators`); None draws from torch's
    global stream."""
    if generators is not None and engine != "decode":
        raise ValueError("per-prompt generators need engine='decode'")
    if engine != "decode" and sharding.lockstep(model) is not None:
        raise ValueError("a sharded model samples with engine='decode' (its passes run in lockstep)")
    eos_ids = _eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    repeated = [p for p in prompts for _ in range(num_samples)]
    ids, attn = left_pad(repeated, pad_id)
    device = next(model.parameters()).device
    ids, attn = ids.to(device), attn.to(device)
    was_training = model.training
    model.eval()
    try:
        if engine == "decode":
            response = prefix_decode(
                model,
                prompts,
                copies=num_samples,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                eos_ids=eos_ids,
                pad_id=pad_id,
                generators=generators,
            )
        else:
            sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
            out = model.generate(
                input_ids=ids,
                attention_mask=attn,
                max_new_tokens=max_new_tokens,
                eos_token_id=eos_ids,
                pad_token_id=pad_id,
                **(sampling if temperature > 0 else {"do_sample": False}),
            )
            response = out[:, ids.shape[1] :]  # (B, T)
    finally:
        if was_training:
            model.train()
    if response.shape[1] == 0:
        response = torch.full((len(repeated), 1), pad_id, dtype=torch.long, device=device)
    mask, truncated = response_mask_from_ids(response, eos_ids)
    response = torch.where(mask.bool(), response, torch.full_like(response, pad_id))
    texts = tokenizer.batch_decode(response, skip_special_tokens=True)
    return Rollout(
        input_ids=torch.cat([ids, response], dim=1),
        attention_mask=torch.cat([attn, mask], dim=1),
        response_mask=mask,
        prompt_length=ids.shape[1],
        texts=texts,
        truncated=truncated.tolist(),
    )


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix every sequence shares."""
    if not sequences:
        return 0
    n = min(len(s) for s in sequences)
    first = sequences[0]
    for i in range(n):
        if any(s[i] != first[i] for s in sequences[1:]):
            return i
    return n


@torch.no_grad()
def prefill(
    model, contexts: Sequence[Sequence[int]], *, copies: int = 1, pad_id: int, share_prefix: bool = True
) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor]:
    """Run `copies` rows of each context through the model, ready for `decode_from`:
    (last logits (B, V), key/value cache, attention mask (B, P), next position (B, 1)),
    B = N · copies, context-major (row n · copies + g).

    The prefill is where the time goes for long contexts (a turn's logged conversation,
    an episode's system prompt and tools), so it runs once per distinct context, not per
    row: the prefix all contexts share goes through the model once at batch 1, then each
    distinct context's remainder, and the cache and logits are copied to the rows that
    continue it. Layout: [shared prefix | left-padded remainder | …]; the attention mask
    is 0 on the padding between prefix and remainder and positions count real tokens
    only, so each row is computed as if it were alone, up to float rounding.
    share_prefix=False prefills every row in full (the reference to compare with)."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    rows = [list(c) for c in contexts for _ in range(copies)]
    if share_prefix:
        slot = {r: k for k, r in enumerate(dict.fromkeys(tuple(r) for r in rows))}
        distinct = [list(r) for r in slot]
        source = [slot[tuple(r)] for r in rows]  # which distinct context each row continues
        # At least one token of every context stays outside the prefix: its forward gives the logits.
        shared = max(0, min(common_prefix_length(distinct), min(len(c) for c in distinct) - 1))
    else:
        distinct, source, shared = rows, list(range(len(rows))), 0
    batch = len(distinct)
    cache = DynamicCache()
    lockstep = sharding.lockstep(model)
    if lockstep is not None and sharding.most(lockstep, int(shared > 0)) and shared == 0:
        # Another process takes a prefix pass: a sharded model's passes are collectives.
        sharding.passes_pad(model, 1, backward=False, device=device)
    if shared > 0:
        prefix = torch.tensor([distinct[0][:shared]], device=device)
        model(input_ids=prefix, past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache.batch_repeat_interleave(batch)
    suffix_ids, suffix_mask = left_pad([c[shared:] for c in distinct], pad_id)
    suffix_ids, suffix_mask = suffix_ids.to(device), suffix_mask.to(device)
    mask = torch.cat([torch.ones((batch, shared), dtype=torch.long, device=device), suffix_mask], dim=1)
    positions = position_ids(mask)
    out = model(
        input_ids=suffix_ids,
        attention_mask=mask,
        position_ids=positions[:, shared:],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    logits, next_position = out.logits[:, -1, :], positions[:, -1:] + 1  # (batch, V), (batch, 1)
    if source != list(range(batch)):
        index = torch.tensor(source, device=device)
        cache.reorder_cache(index)
        logits, mask, next_position = logits[index], mask[index], next_position[index]
    return logits, cache, mask, next_position


@torch.no_grad()
def prefix_decode(
    model,
    contexts: Sequence[Sequence[int]],
    *,
    copies: int = 1,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    eos_ids: Sequence[int],
    pad_id: int,
    share_prefix: bool = True,
    generators: Sequence[torch.Generator] | None = None,
) -> torch.Tensor:
    """Sample `copies` continuations of each context after one `prefill`: (N contexts) →
    (N · copies, T ≤ max_new_tokens), context-major; rows that ended get `pad_id`.
    `generators`: one per context (see `sample`)."""
    with torch.inference_mode() if sharding.lockstep(model) is None else contextlib.nullcontext():
        logits, cache, mask, next_position = prefill(
            model, contexts, copies=copies, pad_id=pad_id, share_prefix=share_prefix
        )
    return decode_from(
        model,
        logits,
        cache,
        mask,
        next_position,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        eos_ids=eos_ids,
        pad_id=pad_id,
        generators=generators,
    )


@torch.no_grad()
def decode_from(
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
) -> torch.Tensor:
    """The sampling loop after a prefill: `logits` (B, V) predict the first new token,
    `cache` is the prefill's key/value cache (extended in place, with inference-mode
    tensors unless the model is sharded: reusable for more decoding), `mask` (B, P) the
    attention mask so far and `next_position` (B, 1) the position of the first new token.
    Returns (B, T ≤ max_new_tokens).

    Samples from softmax(logits / temperature), nucleus-filtered when top_p < 1, greedy
    when temperature is 0; stops when every row has emitted an end token (rows already
    finished get `pad_id`). `generators`: one per context, its rows consecutive
    (B = contexts · copies); each token draws `copies` numbers from each, whether or not
    its rows have ended, so a context's stream does not depend on the others. A model
    sharded over the job's processes decodes until every process's rows have ended
    (`sharding.py`): its passes are collectives."""
    batch = mask.shape[0]
    device = mask.device
    eos = torch.tensor(list(eos_ids), device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    tokens: list[torch.Tensor] = []
    lockstep = sharding.lockstep(model)
    # Autograd's bookkeeping off as well (about a tenth of a small model's decode step on
    # a CPU); a sharded model's passes keep no_grad, as its collectives were written for.
    with torch.inference_mode() if lockstep is None else contextlib.nullcontext():
        cache_reserve(cache, max_new_tokens)
        width = mask.shape[1]
        mask = torch.cat([mask, torch.ones((batch, max_new_tokens), dtype=mask.dtype, device=device)], dim=1)
        mask = _step_mask(model, mask)
        for _ in range(max_new_tokens):
            chosen = next_tokens(
                logits, finished, temperature=temperature, top_p=top_p, generators=generators, pad_id=pad_id
            )
            tokens.append(chosen)
            finished |= torch.isin(chosen, eos)
            running = not bool(finished.all())
            if lockstep is not None:  # until every process's rows have ended
                running = bool(sharding.most(lockstep, int(running)))
            if not running or len(tokens) == max_new_tokens:
                break
            out = model(
                input_ids=chosen.unsqueeze(1),
                attention_mask=mask[..., : width + len(tokens)],
                position_ids=next_position,
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :]
            next_position = next_position + 1
        out_tokens = torch.stack(tokens, dim=1) if tokens else torch.empty((batch, 0), dtype=torch.long, device=device)
    cache_unreserve(cache)
    # A copy made outside inference mode: the rollout's ids go into a pass with gradient.
    return out_tokens.clone() if lockstep is None else out_tokens


def _step_mask(model, mask: torch.Tensor) -> torch.Tensor:
    """The decode loop's attention mask on the CPU: (B, 1, 1, K) booleans where the model
    attends by SDPA over every earlier position, else `mask` (B, K) as it is. A decode step's
    one query is the last position, so the causal part allows every key and the mask is the
    padding alone; given in 4-D, transformers takes it as it is instead of building it again
    at every step (`bench/decode_mask.py` measures the difference). Not on other devices: there
    transformers drops an all-ones mask, which lets CUDA's kernels share grouped key/value
    heads, and a 4-D mask would stop that. A sliding window, another layer type or another
    attention function gets the 2-D mask and its own rules."""
    config = getattr(model, "config", None)
    if mask.device.type != "cpu" or getattr(config, "_attn_implementation", None) != "sdpa":
        return mask
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()):
        return mask
    if getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True):
        return mask
    return mask[:, None, None, :].bool()


def next_tokens(
    logits: torch.Tensor,
    finished: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    generators: Sequence[torch.Generator] | None,
    pad_id: int,
) -> torch.Tensor:
    """One token for each row from its logits (B, V): drawn from softmax(logits /
    temperature), nucleus-filtered when top_p < 1, greedy when temperature is 0, one
    uniform number per row from `generators` (see `decode_from`); `pad_id` where the row
    has `finished` (B,). Returns (B,)."""
    logits = logits.float()
    if temperature <= 0:
        chosen = logits.argmax(dim=-1)
    else:
        probs = torch.softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)
        if top_p < 1.0:
            probs = _nucleus(probs, top_p)
        chosen = _inverse_cdf(probs, _uniforms(generators, logits.shape[0], logits.device))
    return chosen.masked_fill_(finished, pad_id)


def _uniforms(generators: Sequence[torch.Generator] | None, batch: int, device) -> torch.Tensor | None:
    """(B, 1) uniform numbers, `batch / len(generators)` consecutive rows from each
    generator; None without generators (the global stream)."""
    if generators is None:
        return None
    copies, rest = divmod(batch, len(generators))
    if rest:
        raise ValueError(f"{batch} rows do not split into {len(generators)} contexts")
    return torch.cat([torch.rand(copies, generator=g) for g in generators]).unsqueeze(1).to(device)


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """One exact draw per row of `probs` (B, V) → (B,): the first index whose cumulative
    probability exceeds a uniform number (`uniforms` (B, 1), else drawn from the global
    stream). One random number per row, where torch.multinomial draws one per vocabulary
    entry (~2 ms a token at B=64, V=1024 on one CPU thread, a quarter of a small model's
    sampling time)."""
    cdf = probs.cumsum(dim=-1)  # (B, V)
    if uniforms is None:
        uniforms = torch.rand((probs.shape[0], 1), device=probs.device, dtype=cdf.dtype)
    u = uniforms.to(cdf.dtype) * cdf[:, -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=probs.shape[-1] - 1)


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches top_p; renormalise."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p  # mass before this token already ≥ top_p
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def rollout_from_tokens(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    *,
    num_samples: int,
    eos_ids: Sequence[int],
    pad_id: int,
    texts: list[str],
    device: torch.device | str = "cpu",
) -> Rollout:
    """A Rollout from tokens sampled elsewhere (an inference server), same layout as `sample`."""
    repeated = [p for p in prompts for _ in range(num_samples)]
    ids, attn = left_pad(repeated, pad_id)
    width = max(1, max(len(r) for r in responses))
    resp = torch.full((len(responses), width), pad_id, dtype=torch.long)
    for row, r in enumerate(responses):
        resp[row, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    mask, truncated = response_mask_from_ids(resp, eos_ids)
    for row, r in enumerate(responses):
        mask[row, len(r) :] = 0
    return Rollout(
        input_ids=torch.cat([ids, resp], dim=1).to(device),
        attention_mask=torch.cat([attn, mask], dim=1).to(device),
        response_mask=mask.to(device),
        prompt_length=ids.shape[1],
        texts=texts,
        truncated=truncated.tolist(),
    )


def _eos_ids(model, tokenizer) -> list[int]:
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        ids += list(value) if isinstance(value, list | tuple) else [int(value)]
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError("the model and tokenizer name no end-of-sequence token")
    return sorted(set(ids))


def eos_ids(model, tokenizer) -> list[int]:
    """Every token id that ends a response for this model/tokenizer pair."""
    return _eos_ids(model, tokenizer)
