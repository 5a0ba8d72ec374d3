"""Turn-level GRPO on logged contexts.

The environment behind a production trace cannot be replayed, but one assistant turn
given its logged context can: sample G responses from the current policy, score the
group (the judge under the item's rubric, or a programmatic grader), compute group
advantages, update. `grpo_train` reads top to bottom:
rollout → reward → advantages → update → log → monitor → evaluate/checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path
from statistics import fmean, pstdev

import torch

from training.grpo import loss as L
from training.grpo import monitors
from training.grpo.common import (
    Hooks,
    PromptCache,
    TokenMeans,
    TrainResult,
    batch_for_step,
    checkpoint_save,
    evaluate,
    finite_check,
    micro_batches,
    result_close,
    rollout_stats,
    setup_torch,
    step_close,
)
from training.grpo.config import GRPOConfig
from training.grpo.items import Scorer, TurnItem, canary_items, grader_scorer
from training.grpo.policy import (
    Policy,
    latest_checkpoint,
    load_checkpoint,
    load_policy,
    make_optimizer,
)
from training.grpo.sampling import sample, token_logprobs


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
    hooks = hooks or Hooks()
    if canaries is None and config.canaries:
        canaries = canary_items(config.canaries)
    setup_torch(config)
    need_reference = config.beta > 0 or config.log_kl
    policy = policy or load_policy(config, reference=need_reference)
    optimizer = make_optimizer(policy, config)
    prompts = PromptCache(policy.tokenizer)
    rollout_client = None
    if config.rollout == "vllm":
        from training.grpo.vllm_rollout import VllmRollouts

        rollout_client = VllmRollouts(base_url=config.vllm_url, run_dir=run_dir, api_key=vllm_api_key)

    result = TrainResult(status="finished", step=0)
    state: dict = {"history": [], "evals": [], "start_length": None, "start_canary": None, "breaches": []}
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None:
        saved = load_checkpoint(checkpoint, policy=policy, optimizer=optimizer)
        result.step = saved["step"]
        state = saved["state"]
        hooks.emit("log", f"resumed from {checkpoint.name}")
    elif eval_items or canaries:
        _evaluate_into(state, 0, policy, eval_items, canaries, score, config, prompts, hooks, rollout_client)

    denominator = config.prompts_per_step * config.group_size * config.max_new_tokens
    for step in range(result.step + 1, config.steps + 1):
        if hooks.stop_requested():
            checkpoint_save(run_dir, policy, optimizer, step - 1, config, state, hooks)
            result.status = "cancelled"
            break
        started = time.perf_counter()
        hooks.emit("on_phase", "sampling", step, config.steps)
        batch = batch_for_step(items, step=step, size=config.prompts_per_step, seed=config.seed)
        prompt_ids = [prompts.get(it) for it in batch]

        # Rollout: G samples per prompt from the current policy.
        if rollout_client is not None:
            rollout = rollout_client.sample(policy, prompt_ids, step=step, config=config, num_samples=config.group_size)
        else:
            rollout = sample(
                policy.model,
                policy.tokenizer,
                prompt_ids,
                num_samples=config.group_size,
                max_new_tokens=config.max_new_tokens,
                temperature=config.temperature,
                top_p=config.top_p,
            )
        sampled = time.perf_counter()

        # Reward: score each group together (a judge compares candidates side by side).
        rewards: list[float] = []
        for i, item in enumerate(batch):
            group = rollout.texts[i * config.group_size : (i + 1) * config.group_size]
            scores = score(item, group)
            if len(scores) != len(group):
                raise ValueError(f"the scorer returned {len(scores)} rewards for {len(group)} candidates")
            rewards += [float(s) for s in scores]
        reward_tensor = torch.tensor(rewards).view(len(batch), config.group_size)  # (N, G)
        scored = time.perf_counter()

        # Advantages; groups with equal rewards carry no signal and leave the batch.
        advantages, keep = L.group_advantages(
            reward_tensor, baseline=config.baseline, scale_std=config.scale_std, clip=config.advantage_clip
        )
        row_keep = keep.repeat_interleave(config.group_size)  # (B,)
        if not config.drop_zero_variance:
            row_keep = torch.ones_like(row_keep)
        rows = row_keep.nonzero().squeeze(1).to(policy.device)

        # Update: log-probs from the same forward pass as the gradient.
        hooks.emit("on_phase", "update", step, config.steps)
        loss_value = kl_value = grad_norm = 0.0
        clip_fraction = None
        correction: dict[str, float] = {}
        if len(rows) > 0:
            ids = rollout.input_ids.index_select(0, rows)
            attn = rollout.attention_mask.index_select(0, rows)
            mask = rollout.response_mask.index_select(0, rows).float()
            adv = advantages.view(-1).to(policy.device).index_select(0, rows)  # (B',)
            width = mask.shape[1]
            chunks = micro_batches(len(rows), config.micro_batch)
            old_logprobs = ref_logprobs = None
            with torch.no_grad():
                if config.updates_per_batch > 1:
                    old_logprobs = chunked_logprobs(policy.model, ids, attn, chunks, keep=width, config=config)
                if need_reference:
                    with policy.as_reference() as reference:
                        ref_logprobs = chunked_logprobs(reference, ids, attn, chunks, keep=width, config=config)
            sampler_logprobs = weights = None
            if rollout_client is not None and config.sampling_correction:
                sampler_logprobs = rollout.sampler_logprobs.index_select(0, rows)  # (B', T)
                if old_logprobs is not None:
                    # Against the policy that the batch was drawn for (before any update of
                    # this batch), as TRL does with its old log-probs.
                    weights, correction = L.sampling_correction(
                        old_logprobs, sampler_logprobs, mask, cap=config.sampling_correction_cap
                    )
            for _ in range(config.updates_per_batch):
                optimizer.zero_grad(set_to_none=True)
                out = turn_loss_backward(
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
                )
                correction = out["correction"] or correction
                kl_value = out["kl"] if out["kl"] is not None else kl_value
                # The micro-batches' losses add up to the batch's: one non-finite among them shows here.
                loss_value = finite_check(out["loss"], what="loss", step=step)
                norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), config.max_grad_norm)
                grad_norm = finite_check(float(norm), what="gradient norm", step=step)
                optimizer.step()
                clip_fraction = out["clip_fraction"] if out["clip_fraction"] is not None else clip_fraction
        finished = time.perf_counter()

        # Log.
        metrics = {
            "step": step,
            "reward_mean": fmean(rewards),
            "reward_std": pstdev(rewards),
            "zero_variance_share": 1.0 - float(keep.float().mean()),
            "loss": loss_value,
            "kl": kl_value if need_reference else None,
            "grad_norm": grad_norm,
            "clip_fraction": clip_fraction,
            **correction,
            "trained_sequences": len(rows),
            "generated_tokens": int(rollout.lengths.sum()),
            "step_seconds": finished - started,
            "sample_seconds": sampled - started,
            "score_seconds": scored - sampled,
            "update_seconds": finished - scored,
            **rollout_stats(rollout),
        }
        if state["start_length"] is None:
            state["start_length"] = metrics["response_length"]
        state["history"].append(metrics)
        result.step = step
        hooks.emit("on_step", step, metrics)
        if config.samples_every and (step == 1 or step % config.samples_every == 0):
            hooks.emit("on_samples", step, _sample_rows(batch, rollout, rewards, advantages, config.group_size))

        if config.eval_every and (step % config.eval_every == 0 or step == config.steps):
            _evaluate_into(state, step, policy, eval_items, canaries, score, config, prompts, hooks, rollout_client)

        # Monitor.
        breaches = monitors.check(
            config.monitors,
            history=state["history"],
            start_length=state["start_length"],
            start_canary=state["start_canary"],
        )
        if step_close(run_dir, policy, optimizer, step, config, state, hooks, breaches):
            result.status = "stopped"
            break

    return result_close(result, state, policy, run_dir, export, hooks)


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
) -> dict:
    """Accumulate the gradient of `loss.policy_loss` over the batch, one micro-batch of
    rows (`chunks`) per forward/backward pass, each micro-batch's loss scaled by
    `loss.micro_batch_scale` so that the accumulated gradient, and the summed loss, are
    those of one pass over the whole batch under the config's normaliser.

    ids, attn: (B, L); mask: (B, T) the trained response tokens; advantages: (B,);
    old/ref/sampler log-probs and sampling weights: (B, T), sliced with the rows. With
    `sampler_logprobs` and no weights, the weights come from this pass's own log-probs
    (one update per batch: the policy the batch was drawn for). Returns the loss, the KL
    and clip fraction as token means over the batch (None when not measured) and the
    sampling-correction figures ({} without a sampler)."""
    batch_tokens, batch_rows = float(mask.sum()), mask.shape[0]
    width = mask.shape[1]
    means, correction = TokenMeans(), TokenMeans()
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
    }


def _evaluate_into(state, step, policy, eval_items, canaries, score, config, prompts, hooks, server=None) -> None:
    """Evaluate the policy as it is served: with `server` (rollout="vllm") the current
    weights are loaded as an adapter and sampled by the server under the job's
    `structured_outputs`, seeded; otherwise by the local sampler."""
    metrics: dict = {"step": step}
    total = len(eval_items or []) + len(canaries or [])
    if server is not None:
        server.load(policy, step=f"eval-{step}")

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
        if state["start_canary"] is None:
            state["start_canary"] = canary["reward"]
        if state["history"]:
            state["history"][-1]["canary_reward"] = canary["reward"]
    state["evals"].append(metrics)
    hooks.emit("on_eval", step, metrics)


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
