"""Per-token log-probs of a batch in the sampler's layout (`sampling.Rollout`: left-padded
prompts, then responses), with gradient when enabled: one forward pass over the rows, or two
when rows repeat a prompt (a group's samples), the prompt once and the responses on its
copied cache."""

from __future__ import annotations

import torch

from training.trainer import sharding
from training.trainer.sampling import position_ids


def forward_logits(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, keep: int, temperature: float = 1.0
) -> torch.Tensor:
    """Logits (B, keep, V) predicting the last `keep` tokens of `input_ids`.

    Only the positions needed are projected to the vocabulary (`logits_to_keep`), which
    is most of the cost of a small model's forward pass. Logits are divided by the
    sampling temperature, so the log-probs are those of the distribution sampled from."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids(attention_mask),
        logits_to_keep=keep + 1,
        use_cache=False,
    )
    logits = out.logits[:, :-1, :]  # (B, keep, V): position t predicts token t + 1
    if temperature != 1.0:
        logits = logits / temperature
    return logits


def gather_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[token] per position: (B, T, V), (B, T) → (B, T), without
    materialising the full log-softmax twice."""
    logits = logits.float()
    picked = logits.gather(dim=-1, index=tokens.unsqueeze(-1)).squeeze(-1)  # (B, T)
    return picked - torch.logsumexp(logits, dim=-1)


def _attention_only(model) -> bool:
    """Every layer of the model is (full or sliding-window) attention, as far as its config
    names its layers' types."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    kinds = getattr(text, "layer_types", None)
    return not kinds or all(kind in ("full_attention", "sliding_attention") for kind in kinds)


def token_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, keep: int, temperature: float = 1.0
) -> torch.Tensor:
    """(B, keep) log-probs of the last `keep` tokens of each row, with gradient if enabled.

    For a Rollout, keep = T (the response width); for a multi-span mask from
    `chat_tokens`, keep = L - 1 (every token but the first). Rows that share their first
    L - keep tokens (a group's samples of one prompt) send that prompt through the model
    once (`shared_prompt_logprobs`)."""
    shared = shared_prompt_logprobs(model, input_ids, attention_mask, keep=keep, temperature=temperature)
    if shared is not None:
        return shared
    logits = forward_logits(model, input_ids, attention_mask, keep=keep, temperature=temperature)
    return gather_logprobs(logits, input_ids[:, -keep:])


def shared_prompt_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, keep: int, temperature: float = 1.0
) -> torch.Tensor | None:
    """`token_logprobs` in two passes when rows repeat a prompt (their first P = L - keep
    tokens and mask), as GRPO's G samples of a prompt do: each distinct prompt goes
    through the model once, its key/value cache (with gradient) is indexed out to the rows
    that continue it, and the responses' first keep - 1 tokens go through on that cache.
    log p(r_1) comes from the prompt pass's last position, log p(r_t) (t > 1) from the
    response pass; positions and masks are the single pass's, so the values and gradients
    are the same up to float rounding, for about P · (B - distinct) fewer token positions
    forward and backward.

    None (use the single pass) when it would not save: fewer than two rows per distinct
    prompt on average, a prompt or response under two tokens, or a model sharded over
    processes (its passes are collectives every process must take alike); and for a model
    with layers other than attention (linear attention, convolutions: their cached state is
    updated in place, which the gradient cannot go through)."""
    from transformers import DynamicCache

    rows, width = input_ids.shape
    prompt = width - keep
    if prompt < 2 or keep < 2 or rows < 2 or sharding.lockstep(model) is not None or not _attention_only(model):
        return None
    heads = torch.cat([input_ids[:, :prompt], attention_mask[:, :prompt].to(input_ids.dtype)], dim=1)
    distinct, inverse = torch.unique(heads, dim=0, return_inverse=True)
    if 2 * len(distinct) > rows:
        return None
    first = torch.empty(len(distinct), dtype=torch.long, device=input_ids.device)
    first[inverse] = torch.arange(rows, device=input_ids.device)  # any row of each prompt
    positions = position_ids(attention_mask)
    cache = DynamicCache()
    out = model(
        input_ids=input_ids[first, :prompt],
        attention_mask=attention_mask[first, :prompt],
        position_ids=positions[first, :prompt],
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    head = out.logits[:, -1:, :][inverse]  # (B, 1, V): predicts each row's first response token
    cache.reorder_cache(inverse)
    out = model(
        input_ids=input_ids[:, prompt:-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=positions[:, prompt:-1],
        past_key_values=cache,
        use_cache=True,
    )
    logits = torch.cat([head, out.logits], dim=1)  # (B, keep, V)
    if temperature != 1.0:
        logits = logits / temperature
    return gather_logprobs(logits, input_ids[:, -keep:])
