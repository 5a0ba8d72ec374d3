"""The update of full-episode GRPO: the token layout of a batch of episodes, their
log-probs (a shared prefix computed once) and the gradient of the episode loss over
micro-batches."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from training.environments.episodes import Episode
from training.trainer import loss as L
from training.trainer.common import TokenMeans, micro_batches
from training.trainer.config import EpisodesConfig
from training.trainer.episode_tokens import episode_segments, episode_tokens, episode_values
from training.trainer.logprobs import gather_logprobs, token_logprobs
from training.trainer.policy import Policy
from training.trainer.sampling import common_prefix_length, left_pad, position_ids


@dataclass
class EpisodeBatch:
    input_ids: torch.Tensor  # (B, L) left-padded
    attention_mask: torch.Tensor  # (B, L)
    mask: torch.Tensor  # (B, L - 1) 1 on the model's sampled tokens (as targets)
    rows: list[int] = field(default_factory=list)  # which episodes, in order
    sequences: list[list[int]] = field(default_factory=list)  # unpadded ids per row
    masks: list[list[int]] = field(default_factory=list)  # unpadded 0/1 per token per row
    pad_id: int = 0
    # Unpadded per token per row: the server's log-prob of each sampled token (0 on
    # context); None when the episodes were sampled by the trainer's own model.
    sampler_logprobs: list[list[float]] | None = None


def episode_batch(tokenizer, episodes: list[Episode], rows: list[int], pad_id: int) -> EpisodeBatch:
    """Token layout of the chosen episodes: every sequence is the context/sampled
    concatenation of `episode_tokens`; the mask is shifted by one so that mask[:, t]
    marks the target token t + 1 (what `token_logprobs(keep=L-1)` scores). When every
    turn carries the server's log-probs, they are laid out the same way, per token."""
    seqs, masks, sampler = [], [], []
    served = all("logprobs" in c.extra for r in rows for c in episodes[r].completions)
    for r in rows:
        e = episodes[r]
        sampled = [c.extra["ids"] for c in e.completions]
        opening = len(e.task.first_messages())
        segments = episode_segments(tokenizer, e.messages, e.task.tools, sampled, context_messages=opening)
        ids, mask = episode_tokens(segments)
        seqs.append(ids)
        masks.append(mask)
        if served:
            sampler.append(episode_values(segments, [c.extra["logprobs"] for c in e.completions]))
    input_ids, attention = left_pad(seqs, pad_id)
    mask_padded, _ = left_pad(masks, 0)
    return EpisodeBatch(
        input_ids=input_ids,
        attention_mask=attention,
        mask=mask_padded[:, 1:],
        rows=list(rows),
        sequences=seqs,
        masks=masks,
        pad_id=pad_id,
        sampler_logprobs=sampler if served else None,
    )


def shared_prefix_length(sequences: list[list[int]], masks: list[list[int]], *, share_prefix: bool) -> int:
    """How many leading tokens `sequence_logprobs` computes once for all rows: their
    common prefix before the first sampled target, or 0 (one full pass per row) when not
    sharing or when it is too short to be worth a separate pass."""
    shared = common_prefix_length(sequences) if share_prefix and len(sequences) > 1 else 0
    first_target = min(m.index(1) if 1 in m else len(m) for m in masks)
    shared = min(shared, first_target - 1, min(len(s) for s in sequences) - 2)
    return shared if shared >= 8 else 0


def target_values(rows: list[list[float]], shared: int) -> torch.Tensor:
    """Per-token values of the rows (one per token, like the masks) laid out as
    `sequence_logprobs` lays out its targets for a shared prefix of `shared` tokens:
    (b, T), left-padded with 0, value t of a row belonging to the target at t + 1."""
    tails = [row[shared:] for row in rows]
    width = max(len(t) for t in tails)
    out = torch.zeros((len(tails), width), dtype=torch.float32)
    for b, tail in enumerate(tails):
        if tail:
            out[b, width - len(tail) :] = torch.tensor(tail, dtype=torch.float32)
    return out[:, 1:]


def sequence_logprobs(
    model,
    sequences: list[list[int]],
    masks: list[list[int]],
    *,
    pad_id: int,
    temperature: float,
    share_prefix: bool = True,
    shared: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs (b, T), mask (b, T)) of every target token of `sequences`, with the
    gradient when enabled; mask[b, t] = 1 where the target is a token the model sampled.

    With `share_prefix`, the tokens all sequences share before the first sampled token
    (the system prompt, tools and worked example of a job) go through the model once,
    batch 1, and their key/value cache is repeated for the rows; gradients flow back
    through the repeat, so the result (values and gradients) equals one forward pass per
    full row, at a fraction of the cost when the shared part is most of each row.
    `shared`: that prefix's length, when the caller has it already (`shared_prefix_length`)."""
    device = next(model.parameters()).device
    if shared is None:
        shared = shared_prefix_length(sequences, masks, share_prefix=share_prefix)
    if shared == 0:
        ids, attn = left_pad(sequences, pad_id)
        mask_padded, _ = left_pad(masks, 0)
        ids, attn = ids.to(device), attn.to(device)
        keep = ids.shape[1] - 1
        logprobs = token_logprobs(model, ids, attn, keep=keep, temperature=temperature)
        return logprobs, mask_padded[:, 1:].to(device).float()
    from transformers import DynamicCache

    cache = DynamicCache()
    prefix = torch.tensor([sequences[0][:shared]], device=device)
    model(input_ids=prefix, past_key_values=cache, use_cache=True, logits_to_keep=1)
    cache.batch_repeat_interleave(len(sequences))
    suffix_ids, suffix_attn = left_pad([s[shared:] for s in sequences], pad_id)
    suffix_mask, _ = left_pad([m[shared:] for m in masks], 0)
    suffix_ids, suffix_attn = suffix_ids.to(device), suffix_attn.to(device)
    full_attn = torch.cat([torch.ones((len(sequences), shared), dtype=torch.long, device=device), suffix_attn], dim=1)
    out = model(
        input_ids=suffix_ids,
        attention_mask=full_attn,
        position_ids=position_ids(full_attn)[:, shared:],
        past_key_values=cache,
        use_cache=True,
    )
    logits = out.logits[:, :-1, :]  # (b, S - 1, V): suffix position j predicts suffix token j + 1
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = gather_logprobs(logits, suffix_ids[:, 1:])
    return logprobs, suffix_mask[:, 1:].to(device).float()


def episode_loss_backward(
    policy: Policy,
    batch: EpisodeBatch,
    advantages: torch.Tensor,
    *,
    config: EpisodesConfig,
    constant: float,
    micro_batch: int,
    share_prefix: bool = True,
    reference: bool = True,
) -> dict:
    """Accumulate the gradient of the episode loss over micro-batches.

    Per token: -A_episode · w · exp(logp - stopgrad(logp)) + β · k3 (`loss.policy_loss`,
    one update per batch so the ratio is 1), summed over the model's tokens of every turn
    and divided by `constant` (the "constant" normaliser: episodes x the episode token
    budget, so the micro-batches add up to the full-batch loss with no length bias).
    w = `loss.sampling_correction` of this pass's log-probs against the server's, for
    episodes a vLLM server sampled (with `config.sampling_correction`), else 1.
    KL(π ‖ π_start) by k3 is logged as a token mean when asked and `reference` (the step's
    `config.reference_due`: the reference's pass runs only then), else None, and the
    correction's figures ("correction": {} without a server) as token means over the batch."""
    device = policy.device
    total_loss = 0.0
    means, correction = TokenMeans(), TokenMeans()
    sampler_rows = batch.sampler_logprobs if config.sampling_correction else None
    for rows in micro_batches(len(batch.sequences), micro_batch):
        seqs, masks = batch.sequences[rows], batch.masks[rows]
        adv = advantages[rows].to(device)
        # One layout for the policy, the reference and the server's log-probs.
        shared = shared_prefix_length(seqs, masks, share_prefix=share_prefix)
        options = {"pad_id": batch.pad_id, "temperature": config.temperature, "shared": shared}
        logprobs, mask = sequence_logprobs(policy.model, seqs, masks, **options)
        tokens = float(mask.sum())
        ref = weights = None
        if reference and (config.beta > 0 or config.log_kl):
            with torch.no_grad(), policy.as_reference() as frozen:
                ref, _ = sequence_logprobs(frozen, seqs, masks, **options)
        if sampler_rows is not None:
            sampler = target_values(sampler_rows[rows], shared).to(device)  # (b, T), as logprobs
            weights, stats = L.sampling_correction(logprobs, sampler, mask, cap=config.sampling_correction_cap)
            correction.add(stats, tokens)
        loss, stats = L.policy_loss(
            logprobs,
            adv,
            mask,
            ref_logprobs=ref,
            beta=config.beta,
            normaliser="constant",
            constant=constant,
            sampling_weights=weights,
        )
        means.add(stats, tokens)
        loss.backward()
        total_loss += float(loss.detach())
    return {"loss": total_loss, "kl": means.get("kl"), "correction": correction.as_dict()}
