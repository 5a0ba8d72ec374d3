"""Hinted GRPO: where a group gives no gradient, an operator's comment can.

A group whose G samples all score the same (typically all fail) has no advantage to learn
from. When its item carries feedback, `hinted_batch` draws `hint_samples` more from the same
policy with the comment as a hint (`hint_sample`); the step scores them with the same
scorer, and `hinted_batch` lays out one batch of every sample under the student's own context (no hint), with the advantages of
each enlarged group of G + K and the hinted policy's log-probs of the hinted tokens, for
`loss.hint_weights` (docs/decisions/0024-hinted-grpo.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean

import torch

from training.trainer import loss as L
from training.trainer.common import PromptCache, group_rewards, micro_batches
from training.trainer.config import GRPOConfig
from training.trainer.items import Scorer, TurnItem, with_hint
from training.trainer.logprobs import token_logprobs
from training.trainer.sampling import Rollout, eos_ids, rollout_from_tokens, sample


@dataclass
class HintedBatch:
    """Every sample of a step, plain rows first (as sampled), then each hinted group's K.

    rollout: all rows under the unhinted context; advantages: (B,); rows: (B',) the rows to
    train; behaviour_logprobs: (B, T) log π_b of the hinted rows' tokens (0 elsewhere);
    hinted: (B,) bool; chosen: the hinted groups; hinted_rewards: the hinted rows' rewards."""

    rollout: Rollout
    advantages: torch.Tensor
    rows: torch.Tensor
    behaviour_logprobs: torch.Tensor
    hinted: torch.Tensor
    chosen: list[int] = field(default_factory=list)
    hinted_rewards: list[float] = field(default_factory=list)


def hint_messages(item: TurnItem, config: GRPOConfig) -> list[dict]:
    """The item's context with its feedback as the hint, where `config.hint_at` puts it."""
    return with_hint(item.messages, config.hint_template.format(feedback=item.feedback), at=config.hint_at)


def hint_groups(batch: list[TurnItem], keep: torch.Tensor) -> list[int]:
    """The groups to hint: those with no reward variance (keep (N,) False) whose item has
    feedback."""
    return [i for i, item in enumerate(batch) if not bool(keep[i]) and item.feedback.strip()]


def hint_round(
    policy,
    *,
    config: GRPOConfig,
    batch: list[TurnItem],
    prompts: PromptCache,
    prompt_ids: list[list[int]],
    rollout: Rollout,
    rewards: list[float],
    advantages: torch.Tensor,
    keep: torch.Tensor,
    rows: torch.Tensor,
    score: Scorer,
) -> tuple[HintedBatch | None, dict]:
    """The hint part of a GRPO step: which groups to hint, their hinted samples, scored with
    the step's `score`, and the enlarged batch (None when no group is hinted).

    rollout, rewards: the N·G plain samples; advantages (N, G), keep (N,), rows (B'): the
    plain groups' (`group_advantages_kept`). Metrics: "zero_variance_groups" (groups of the
    policy's own samples with one reward), "hinted_groups" (those whose item has feedback:
    each got K hinted samples), "hinted_groups_with_variance" (hinted groups whose G + K
    rewards differ: they now give a gradient) and "hint_reward_mean" (the hinted samples'
    mean reward; None without any)."""
    chosen = hint_groups(batch, keep)
    metrics: dict = {
        "zero_variance_groups": int((~keep).sum()),
        "hinted_groups": len(chosen),
        "hinted_groups_with_variance": 0,
        "hint_reward_mean": None,
    }
    if not chosen:
        return None, metrics
    items = [batch[i] for i in chosen]
    drawn, behaviour = hint_sample(policy, items, config=config, prompts=prompts)
    hinted_rewards = group_rewards(items, drawn.texts, score, group_size=config.hint_samples)
    hinted, gained = hinted_batch(
        policy,
        config=config,
        prompt_ids=prompt_ids,
        rollout=rollout,
        rewards=rewards,
        advantages=advantages,
        rows=rows,
        chosen=chosen,
        drawn=drawn,
        behaviour=behaviour,
        hinted_rewards=hinted_rewards,
    )
    metrics |= {"hinted_groups_with_variance": gained, "hint_reward_mean": fmean(hinted_rewards)}
    return hinted, metrics


def hint_sample(
    policy, items: list[TurnItem], *, config: GRPOConfig, prompts: PromptCache
) -> tuple[Rollout, torch.Tensor]:
    """`hint_samples` samples per item from the policy with the item's feedback as a hint,
    and the behaviour log-probs of their tokens: (rollout, (H·K, T_h)), taken at the
    sampling temperature before any update (a constant of the gradient)."""
    hinted_prompts = [
        prompts.get(it, variant=f"hint-{config.hint_at}", messages=hint_messages(it, config)) for it in items
    ]
    drawn = sample(
        policy.model,
        policy.tokenizer,
        hinted_prompts,
        num_samples=config.hint_samples,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
    )
    width = drawn.response_mask.shape[1]
    # In eval mode, as `sample` drew them: with LoRA dropout, a train-mode pass would give
    # log-probs of a randomly thinned policy, not of the distribution sampled from.
    was_training = policy.model.training
    policy.model.eval()
    try:
        behaviour = _behaviour_logprobs(policy, drawn, width=width, config=config)
    finally:
        if was_training:
            policy.model.train()
    return drawn, behaviour


@torch.no_grad()
def _behaviour_logprobs(policy, drawn: Rollout, *, width: int, config: GRPOConfig) -> torch.Tensor:
    """log π_b of the drawn tokens under their hinted context: (H·K, T_h)."""
    return torch.cat(
        [
            token_logprobs(
                policy.model, drawn.input_ids[c], drawn.attention_mask[c], keep=width, temperature=config.temperature
            )
            for c in micro_batches(len(drawn.texts), config.micro_batch)
        ]
    )


def hinted_batch(
    policy,
    *,
    config: GRPOConfig,
    prompt_ids: list[list[int]],
    rollout: Rollout,
    rewards: list[float],
    advantages: torch.Tensor,
    rows: torch.Tensor,
    chosen: list[int],
    drawn: Rollout,
    behaviour: torch.Tensor,
    hinted_rewards: list[float],
) -> tuple[HintedBatch, int]:
    """The step's batch with the hinted groups enlarged, and how many of them now have
    reward variance (their G + K rewards differ).

    prompt_ids: the N unhinted contexts; rollout, rewards: the N·G plain samples;
    advantages (N, G), rows (B',): the plain groups' (`group_advantages_kept`); chosen: the
    hinted groups (`hint_groups`), whose K samples each are `drawn` (H·K rows, group-major),
    with `behaviour` log-probs and `hinted_rewards`."""
    group, extra = config.group_size, config.hint_samples
    # Advantages over each enlarged group: its G plain rewards, then its K hinted ones.
    enlarged = torch.tensor(
        [
            rewards[i * group : (i + 1) * group] + hinted_rewards[j * extra : (j + 1) * extra]
            for j, i in enumerate(chosen)
        ]
    )  # (H, G + K)
    enlarged_adv, enlarged_keep = L.group_advantages(
        enlarged, baseline=config.baseline, scale_std=config.scale_std, clip=config.advantage_clip
    )

    plain_adv = advantages.detach().clone().view(-1, group)  # (N, G)
    train = set(rows.tolist())
    plain_rows = len(rollout.texts)
    for j, i in enumerate(chosen):
        plain_adv[i] = enlarged_adv[j, :group]
        if bool(enlarged_keep[j]) or not config.drop_zero_variance:
            train.update(range(i * group, (i + 1) * group))
            train.update(range(plain_rows + j * extra, plain_rows + (j + 1) * extra))
    all_adv = torch.cat([plain_adv.view(-1), enlarged_adv[:, group:].reshape(-1)])  # (B,)

    # One layout of every row, each after the student's context: plain rows as they were
    # sampled, hinted rows' tokens moved from the hinted context to the unhinted one.
    responses = _responses(rollout) + _responses(drawn)
    contexts = [prompt_ids[n] for n in range(len(prompt_ids)) for _ in range(group)]
    contexts += [prompt_ids[i] for i in chosen for _ in range(extra)]
    combined = rollout_from_tokens(
        contexts,
        responses,
        num_samples=1,
        eos_ids=eos_ids(policy.model, policy.tokenizer),
        pad_id=policy.tokenizer.pad_token_id,
        texts=rollout.texts + drawn.texts,
        device=policy.device,
    )
    combined.truncated = rollout.truncated + drawn.truncated
    total_width = combined.response_mask.shape[1]
    behaviour_all = torch.zeros((len(responses), total_width), dtype=behaviour.dtype, device=policy.device)
    keep_width = min(behaviour.shape[1], total_width)
    behaviour_all[plain_rows:, :keep_width] = behaviour[:, :keep_width].to(policy.device)
    hinted = torch.zeros(len(responses), dtype=torch.bool, device=policy.device)
    hinted[plain_rows:] = True
    out = HintedBatch(
        rollout=combined,
        advantages=all_adv,
        rows=torch.tensor(sorted(train), dtype=torch.long),
        behaviour_logprobs=behaviour_all,
        hinted=hinted,
        chosen=chosen,
        hinted_rewards=hinted_rewards,
    )
    return out, int(enlarged_keep.sum())


def hint_sample_rows(batch: list[TurnItem], hinted: HintedBatch, config: GRPOConfig) -> list[dict]:
    """The hinted samples, after the plain ones: each with the hint it was drawn with."""
    rows = []
    advantages = hinted.advantages.tolist()
    plain_rows = len(batch) * config.group_size
    for j, i in enumerate(hinted.chosen):
        item = batch[i]
        last_user = next((m.get("content") for m in reversed(item.messages) if m.get("role") == "user"), "")
        for g in range(config.hint_samples):
            k = plain_rows + j * config.hint_samples + g
            rows.append(
                {
                    "item": item.id,
                    "prompt": (last_user or "")[:2000],
                    "response": hinted.rollout.texts[k][:4000],
                    "reward": hinted.hinted_rewards[j * config.hint_samples + g],
                    "advantage": round(advantages[k], 4),
                    "truncated": hinted.rollout.truncated[k],
                    "hint": config.hint_template.format(feedback=item.feedback)[:2000],
                }
            )
    return rows


def _responses(rollout: Rollout) -> list[list[int]]:
    """Each row's sampled tokens, up to and including its end token."""
    ids, mask = rollout.response_ids.tolist(), rollout.response_mask.tolist()
    return [[t for t, m in zip(row, keep, strict=True) if m] for row, keep in zip(ids, mask, strict=True)]
