"""Turn-level GRPO on logged contexts.

The environment behind a production trace cannot be replayed, but one assistant turn
given its logged context can: sample G responses from the current policy, score the
group (the judge under the item's rubric, or a programmatic grader), compute group
advantages, update. `turn_step` is that step, top to bottom:
rollout → reward → advantages → update → metrics; `run.run_training` runs the steps
(resume, evaluation, monitors, checkpoints, export).

The reference (the starting version) costs a forward pass over the batch, and with β = 0
(the default) its only use is the logged KL(π ‖ π_start). So the pass runs at every step
only when the loss or a monitor needs it (β > 0, or a `monitors.kl_budget`); otherwise at
the steps that evaluate and at the last one (`GRPOConfig.reference_due`), and the other
steps log the KL as None. The sampling log-probs could not stand in for it: they are the
policy's own, so against the policy they measure the drift within one step (exactly 0 with
one update per batch), not the drift from the start that the chart and the budget are
about (docs/decisions/0044-kl-at-evaluation-steps.md).
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import fmean, pstdev

import torch

from training.trainer import hints, sharding
from training.trainer import loss as L
from training.trainer.common import (
    Hooks,
    PromptCache,
    TokenMeans,
    evaluate,
    finite_check,
    group_advantages_kept,
    group_rewards,
    micro_batches,
    phase_seconds,
    rollout_stats,
)
from training.trainer.config import GRPOConfig
from training.trainer.items import Scorer, TurnItem, canary_items, grader_scorer
from training.trainer.logprobs import token_logprobs
from training.trainer.parallel import item_generators, item_seeds, rollout_seen
from training.trainer.policy import Policy
from training.trainer.run import (
    RunState,
    StepFn,
    StepOutput,
    Trainer,
    TrainResult,
    run_training,
    trainer_setup,
    turn_monitors,
)
from training.trainer.sampling import Rollout, sample
from training.trainer.vllm_colocate import ColocatedRollouts, adapter_rank
from training.trainer.vllm_rollout import VllmRollouts


def grpo_train(
    *,
    config: GRPOConfig,
    items: list[TurnItem],
    score: Scorer,
    run_dir: Path,
    eval_items: list[TurnItem] | None = None,
    canaries: list[TurnItem] | None = None,
    hooks: Hooks | None = None,
    policy: Policy | None = None,
    export: bool = True,
    vllm_api_key: str = "",
) -> TrainResult:
    """Train for `config.steps` steps, resuming from `run_dir`'s latest checkpoint if
    there is one. Returns how it ended; the trained version is exported to
    `run_dir/model` when it finishes (also when stopped by a monitor: the candidate is
    kept for inspection, and nothing is deployed without a person's approval).
    `vllm_api_key`: the inference server's key, for `rollout="vllm"`."""
    if config.hint_samples and config.rollout != "local":
        # Not validated when a script builds the config itself; the hinted samples' π_b is
        # the local sampler's, and mixing it with a server's rows would drop their correction.
        raise ValueError("hint_samples needs rollout 'local': the trainer draws the hinted samples itself")
    hooks = hooks or Hooks()
    if canaries is None and config.canaries:
        canaries = canary_items(config.canaries)
    trainer = trainer_setup(config, policy=policy, reference=config.beta > 0 or config.log_kl)
    prompts = PromptCache(trainer.policy.tokenizer)
    server = None
    if config.rollout == "vllm":
        server = VllmRollouts(base_url=config.vllm_url, run_dir=run_dir, api_key=vllm_api_key, ranks=trainer.ranks)
    elif config.rollout == "colocate":
        server = ColocatedRollouts(config=config, run_dir=run_dir, lora_rank=adapter_rank(trainer.policy))

    def evaluate_now(step: int, state: RunState) -> dict:
        return _evaluation(state, step, trainer.policy, eval_items, canaries, score, config, prompts, hooks, server)

    try:
        return run_training(
            trainer,
            items=items,
            step=turn_step(trainer, score, prompts=prompts, hooks=hooks, server=server),
            run_dir=run_dir,
            hooks=hooks,
            evaluate=evaluate_now,
            # A job with neither still records an empty evaluation at each due step (not at
            # the start), as it always has.
            evaluate_at_start=bool(eval_items or canaries),
            monitor=turn_monitors(config),
            export=export,
        )
    finally:
        if server is not None:
            server.close()


def turn_step(trainer: Trainer, score: Scorer, *, prompts: PromptCache, hooks: Hooks, server) -> StepFn:
    """Step n of turn-level GRPO: rollout → reward → advantages → update → metrics.
    `server` (a `VllmRollouts`): sample there under the current adapter, else locally."""
    config, policy = trainer.config, trainer.policy
    group = config.group_size

    def step(n: int, batch: list[TurnItem], started: float) -> StepOutput:
        prompt_ids = [prompts.get(it) for it in batch]

        # Rollout: G samples per prompt from the current policy.
        if server is not None:
            seeds = item_seeds(trainer.ranks, seed=config.seed, step=n, count=len(batch))
            rollout = server.sample(policy, prompt_ids, step=n, config=config, num_samples=group, seeds=seeds)
        else:
            rollout = sample(
                policy.model,
                policy.tokenizer,
                prompt_ids,
                num_samples=group,
                max_new_tokens=config.max_new_tokens,
                temperature=config.temperature,
                top_p=config.top_p,
                generators=item_generators(trainer.ranks, seed=config.seed, step=n, count=len(batch)),
            )
        sampled = time.perf_counter()
        rewards = group_rewards(batch, rollout.texts, score, group_size=group)
        advantages, keep, rows = group_advantages_kept(rewards, groups=len(batch), config=config)

        # Hints: groups with one reward and an operator's comment get K samples more, drawn
        # with the comment in context and trained on without it (docs/decisions/0024).
        hinted, hint_metrics = None, {}
        if config.hint_samples > 0:
            hinted, hint_metrics = hints.hint_round(
                policy,
                config=config,
                batch=batch,
                prompts=prompts,
                prompt_ids=prompt_ids,
                rollout=rollout,
                rewards=rewards,
                advantages=advantages,
                keep=keep,
                rows=rows,
                score=score,
            )
        scored = time.perf_counter()

        hooks.emit("on_phase", "update", n, config.steps)
        if hinted is None:
            update = turn_update(
                trainer, rollout, advantages, rows.to(policy.device), step=n, served=server is not None
            )
        else:
            update = turn_update(
                trainer,
                hinted.rollout,
                hinted.advantages,
                hinted.rows.to(policy.device),
                step=n,
                served=False,
                behaviour_logprobs=hinted.behaviour_logprobs,
                hinted=hinted.hinted,
            )
            rows = hinted.rows
        finished = time.perf_counter()
        seen = rollout_seen(trainer.ranks, rollout, rewards=rewards, keep=keep)  # the global batch's figures
        metrics = {
            "step": n,
            "reward_mean": fmean(seen.rewards),
            "reward_std": pstdev(seen.rewards),
            "zero_variance_share": 1.0 - float(seen.keep.float().mean()),
            "loss": update["loss"],
            "kl": update["kl"],  # None at a step that does not measure it
            "grad_norm": update["grad_norm"],
            "clip_fraction": update["clip_fraction"],
            **update["correction"],
            **hint_metrics,
            **update["hint"],
            "trained_sequences": update["trained_sequences"],
            "generated_tokens": int(seen.lengths.sum() if hinted is None else hinted.rollout.lengths.sum()),
            **phase_seconds(started, sampled, scored, finished),
            **rollout_stats(seen),
        }

        def samples() -> list[dict]:
            if hinted is None:
                return _sample_rows(batch, rollout, rewards, advantages, group)
            plain = hinted.advantages[: len(rollout.texts)]
            return _sample_rows(batch, rollout, rewards, plain, group) + hints.hint_sample_rows(batch, hinted, config)

        return StepOutput(metrics, samples=samples)

    return step


def turn_update(
    trainer: Trainer,
    rollout: Rollout,
    advantages: torch.Tensor,
    rows: torch.Tensor,
    *,
    step: int,
    served: bool,
    behaviour_logprobs: torch.Tensor | None = None,
    hinted: torch.Tensor | None = None,
) -> dict:
    """`updates_per_batch` optimiser steps on the kept `rows` of `rollout`, log-probs from
    the same forward pass as the gradient. `served`: the rollout came from a vLLM server
    and carries its log-probs, for the sampling correction. `behaviour_logprobs` (B, T) and
    `hinted` (B,): rows drawn with a hint, weighed by `loss.hint_weights`. Returns the loss,
    KL, gradient norm, clip fraction, correction and hint figures of the last update (zeros
    with no rows). The reference's pass runs, and the KL is measured, only at the steps
    `config.reference_due` names (every step with β > 0); at the others the KL is None.

    In a data-parallel job `rows` are this process's; the normaliser's counts, the loss,
    the KL and the clip fraction are the global batch's. A process whose groups were all
    dropped still takes part in every update (its gradient is zero), and no process steps
    when no group of the global batch carried signal. (Hinted rows run in one process:
    the config refuses hints with `processes` > 1.)"""
    config, policy, ranks = trainer.config, trainer.policy, trainer.ranks
    reference = config.reference_due(step)  # the same on every process: collectives match
    out = {
        "loss": 0.0,
        "kl": 0.0 if reference else None,
        "grad_norm": 0.0,
        "clip_fraction": None,
        "correction": {},
        "hint": {},
        "trained_sequences": 0,
    }
    if hinted is not None:
        out["hint"] = {"hint_weight_mean": None, "hint_truncated_share": None}
    busy = len(rows) > 0
    local_tokens = float(rollout.response_mask.index_select(0, rows).sum()) if busy else 0.0
    batch_tokens, batch_rows = ranks.sum(local_tokens, len(rows))
    out["trained_sequences"] = int(batch_rows)
    if batch_rows == 0:
        return out
    chunks = micro_batches(len(rows), config.micro_batch) if busy else []
    # A sharded model's passes are collectives: every process takes as many as the busiest.
    pad = sharding.most(ranks, len(chunks)) - len(chunks) if trainer.sharded else 0
    if not busy:
        if config.updates_per_batch > 1:  # the old log-probs' passes
            sharding.passes_pad(policy.model, pad, backward=False, device=policy.device)
        if reference:  # the reference's
            sharding.passes_pad(policy.model, pad, backward=False, device=policy.device)
        for _ in range(config.updates_per_batch):
            trainer.optimizer.zero_grad(set_to_none=True)
            sharding.passes_pad(policy.model, pad, backward=True, device=policy.device)
            out.update(_global_figures(ranks, {"loss": 0.0}, 0.0, batch_tokens, config, kl=reference))
            out["loss"] = finite_check(out["loss"], what="loss", step=step)
            out["grad_norm"] = trainer.clip_and_step(step=step)
        return out
    ids = rollout.input_ids.index_select(0, rows)
    attn = rollout.attention_mask.index_select(0, rows)
    mask = rollout.response_mask.index_select(0, rows).float()
    adv = advantages.view(-1).to(policy.device).index_select(0, rows)  # (B',)
    width = mask.shape[1]
    old_logprobs = ref_logprobs = None
    with torch.no_grad():
        if config.updates_per_batch > 1:
            old_logprobs = chunked_logprobs(policy.model, ids, attn, chunks, keep=width, config=config)
            sharding.passes_pad(policy.model, pad, backward=False, device=policy.device)
        if reference:
            with policy.as_reference() as frozen:
                ref_logprobs = chunked_logprobs(frozen, ids, attn, chunks, keep=width, config=config)
                sharding.passes_pad(frozen, pad, backward=False, device=policy.device)
    sampler_logprobs = weights = None
    if served and config.sampling_correction:
        sampler_logprobs = rollout.sampler_logprobs.index_select(0, rows)  # (B', T)
        if old_logprobs is not None:
            # Against the policy that the batch was drawn for (before any update of
            # this batch), as TRL does with its old log-probs.
            weights, out["correction"] = L.sampling_correction(
                old_logprobs, sampler_logprobs, mask, cap=config.sampling_correction_cap
            )
    behaviour = hinted_rows = None
    if hinted is not None and behaviour_logprobs is not None:
        behaviour = behaviour_logprobs.index_select(0, rows)  # (B', T)
        hinted_rows = hinted.index_select(0, rows)  # (B',)
        if old_logprobs is not None:
            # As for the sampler: against the policy before this batch's first update.
            hint_w, stats = L.hint_weights(old_logprobs, behaviour, mask, hinted_rows, cap=config.hint_cap)
            if float(mask[hinted_rows].sum()) > 0:
                out["hint"] = stats
            weights = hint_w if weights is None else weights * hint_w
            behaviour = None
    denominator = config.prompts_per_step * config.group_size * config.max_new_tokens
    for _ in range(config.updates_per_batch):
        trainer.optimizer.zero_grad(set_to_none=True)
        passed = turn_loss_backward(
            policy.model,
            ids,
            attn,
            mask,
            adv,
            chunks=chunks,
            config=config,
            constant=denominator,
            old_logprobs=old_logprobs,
            ref_logprobs=ref_logprobs,
            sampler_logprobs=sampler_logprobs if weights is None else None,
            sampling_weights=weights,
            behaviour_logprobs=behaviour,
            hinted=hinted_rows,
            batch_tokens=batch_tokens,
            batch_rows=int(batch_rows),
        )
        sharding.passes_pad(policy.model, pad, backward=True, device=policy.device)
        out["correction"] = passed["correction"] or out["correction"]
        out["hint"] = passed["hint"] or out["hint"]
        out.update(_global_figures(ranks, passed, local_tokens, batch_tokens, config, kl=reference))
        # The micro-batches' losses add up to the batch's: one non-finite among them shows here.
        out["loss"] = finite_check(out["loss"], what="loss", step=step)
        out["grad_norm"] = trainer.clip_and_step(step=step)
    return out


def _global_figures(ranks, passed: dict, tokens: float, batch_tokens: float, config: GRPOConfig, *, kl: bool) -> dict:
    """An update's loss (the processes' parts add up to it), KL and clip fraction (token
    means, each process's weighed by its trained tokens) over the global batch. Which of
    them is measured is the config's and the step's to say (`kl`: the reference ran), the
    same on every process."""
    measured, clip = passed.get("kl"), passed.get("clip_fraction")
    loss, kl_sum, clip_sum = ranks.sum(passed["loss"], (measured or 0.0) * tokens, (clip or 0.0) * tokens)
    figures: dict = {"loss": loss}
    if kl:
        figures["kl"] = measured if ranks.size == 1 else kl_sum / batch_tokens if batch_tokens else 0.0
    if config.updates_per_batch > 1:
        figures["clip_fraction"] = clip if ranks.size == 1 else clip_sum / batch_tokens if batch_tokens else 0.0
    return figures


def chunked_logprobs(model, ids, attn, chunks: list[slice], *, keep: int, config: GRPOConfig) -> torch.Tensor:
    """`token_logprobs` of the rows, one micro-batch at a time: (B, keep)."""
    return torch.cat(
        [token_logprobs(model, ids[c], attn[c], keep=keep, temperature=config.temperature) for c in chunks]
    )


def turn_loss_backward(
    model,
    ids: torch.Tensor,
    attn: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    *,
    chunks: list[slice],
    config: GRPOConfig,
    constant: float,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    sampler_logprobs: torch.Tensor | None = None,
    sampling_weights: torch.Tensor | None = None,
    behaviour_logprobs: torch.Tensor | None = None,
    hinted: torch.Tensor | None = None,
    batch_tokens: float | None = None,
    batch_rows: int | None = None,
) -> dict:
    """Accumulate the gradient of `loss.policy_loss` over the batch, one micro-batch of
    rows (`chunks`) per forward/backward pass, each micro-batch's loss scaled by
    `loss.micro_batch_scale` so that the accumulated gradient, and the summed loss, are
    those of one pass over the whole batch under the config's normaliser.

    ids, attn: (B, L); mask: (B, T) the trained response tokens; advantages: (B,);
    old/ref/sampler log-probs and sampling weights: (B, T), sliced with the rows. With
    `sampler_logprobs` and no weights, the weights come from this pass's own log-probs
    (one update per batch: the policy the batch was drawn for); `behaviour_logprobs` (B, T)
    with `hinted` (B,) the same way for rows drawn with a hint (`loss.hint_weights`).
    Returns the loss, the KL and clip fraction as token means over the batch (None when
    not measured), the sampling-correction figures ({} without a sampler) and the hint
    figures over the hinted tokens ({} without hinted rows). `batch_tokens`, `batch_rows`:
    the normaliser's counts when the batch is larger than these rows (a data-parallel
    job's global batch); by default these rows' own."""
    batch_tokens = float(mask.sum()) if batch_tokens is None else batch_tokens
    batch_rows = mask.shape[0] if batch_rows is None else batch_rows
    width = mask.shape[1]
    means, correction, hint = TokenMeans(), TokenMeans(), TokenMeans()
    total = 0.0
    for c in chunks:
        logprobs = token_logprobs(model, ids[c], attn[c], keep=width, temperature=config.temperature)  # (b, T)
        weights = sampling_weights[c] if sampling_weights is not None else None
        tokens = float(mask[c].sum())
        if sampler_logprobs is not None and weights is None:
            weights, stats = L.sampling_correction(
                logprobs, sampler_logprobs[c], mask[c], cap=config.sampling_correction_cap
            )
            correction.add(stats, tokens)
        if behaviour_logprobs is not None and hinted is not None:
            hint_w, stats = L.hint_weights(logprobs, behaviour_logprobs[c], mask[c], hinted[c], cap=config.hint_cap)
            weights = hint_w if weights is None else weights * hint_w
            hinted_tokens = float(mask[c][hinted[c]].sum())
            if hinted_tokens > 0:  # a step that trains no hinted token logs None, not a weight of 0
                hint.add(stats, hinted_tokens)
        # β·k3 is added per token, under the policy term's normaliser (as TRL does).
        loss, stats = L.policy_loss(
            logprobs,
            advantages[c],
            mask[c],
            old_logprobs=old_logprobs[c] if old_logprobs is not None else None,
            ref_logprobs=ref_logprobs[c] if ref_logprobs is not None else None,
            beta=config.beta,
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            normaliser=config.normaliser,
            constant=constant,
            sampling_weights=weights,
        )
        means.add(stats, tokens)
        scale = L.micro_batch_scale(
            mask[c], normaliser=config.normaliser, batch_tokens=batch_tokens, batch_rows=batch_rows
        )
        (loss * scale).backward()
        total += float(loss.detach()) * scale
    return {
        "loss": total,
        "kl": means.get("kl"),
        "clip_fraction": means.get("clip_fraction"),
        "correction": correction.as_dict(),
        "hint": hint.as_dict(),
    }


def _evaluation(state, step, policy, eval_items, canaries, score, config, prompts, hooks, server=None) -> dict:
    """Evaluate the policy as it is served: with `server` (rollout="vllm") the current
    weights are loaded as an adapter and sampled by the server under the job's
    `structured_outputs`, seeded; otherwise by the local sampler. The first canary reward
    becomes the canary monitor's baseline, and each goes into the step's metrics too."""
    metrics: dict = {"step": step}
    total = len(eval_items or []) + len(canaries or [])
    if server is not None and total:  # nothing to sample: no adapter to load (nor an engine to wake)
        server.load(policy, step=f"eval-{step}")
        if not server.ranks.owner:  # a sharded job's other processes joined the adapter's gather; the server samples
            return metrics

    def progress(done: int, _: int, offset: int = 0) -> None:
        hooks.emit("on_phase", "evaluation", offset + done, total)

    progress(0, total)
    if eval_items:
        metrics.update(
            evaluate(policy, eval_items, score, config=config, prompts=prompts, progress=progress, server=server)
        )
    if canaries:
        canary = evaluate(
            policy,
            canaries,
            grader_scorer(),
            config=config,
            prompts=prompts,
            progress=lambda done, t: progress(done, t, offset=len(eval_items or [])),
            server=server,
        )
        metrics["canary_reward"] = canary["reward"]
        if state.start_canary is None:
            state.start_canary = canary["reward"]
        if state.history:
            state.history[-1]["canary_reward"] = canary["reward"]
    return metrics


def _sample_rows(batch, rollout, rewards, advantages, group_size) -> list[dict]:
    rows = []
    flat_adv = advantages.view(-1).tolist()
    for i, item in enumerate(batch):
        last_user = next((m.get("content") for m in reversed(item.messages) if m.get("role") == "user"), "")
        for g in range(group_size):
            k = i * group_size + g
            rows.append(
                {
                    "item": item.id,
                    "prompt": (last_user or "")[:2000],
                    "response": rollout.texts[k][:4000],
                    "reward": rewards[k],
                    "advantage": round(flat_adv[k], 4),
                    "truncated": rollout.truncated[k],
                }
            )
    return rows
