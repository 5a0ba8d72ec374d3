"""Self-distillation: SFT on corrected responses, and feedback-conditioned on-policy
distillation (teacher = the policy with the feedback as a system hint, student = the
policy without it, per-token reverse KL on the student's own samples).

Both loops read top to bottom like `grpo_train` and share its checkpoint/resume,
callbacks and monitors."""

from __future__ import annotations

import time
from pathlib import Path
from statistics import fmean

import torch

from training.grpo import loss as L
from training.grpo import monitors
from training.grpo.common import (
    Hooks,
    PromptCache,
    TrainResult,
    batch_for_step,
    checkpoint_save,
    evaluate,
    finite_check,
    result_close,
    rollout_stats,
    setup_torch,
    step_close,
)
from training.grpo.config import DistillConfig, SFTConfig
from training.grpo.items import Scorer, TurnItem, with_hint
from training.grpo.policy import (
    Policy,
    latest_checkpoint,
    load_checkpoint,
    load_policy,
    make_optimizer,
)
from training.grpo.sampling import encode_target, forward_logits, left_pad, rollout_from_tokens, sample, token_logprobs


def distill_train(
    *,
    config: DistillConfig,
    items: list[TurnItem],
    run_dir: Path,
    eval_items: list[TurnItem] | None = None,
    eval_score: Scorer | None = None,
    hooks: Hooks | None = None,
    policy: Policy | None = None,
    export: bool = True,
) -> TrainResult:
    """Each item's `feedback` becomes the teacher's hint. `eval_score` (a grader or the
    judge) measures compliance *without* the hint on `eval_items`."""
    hooks = hooks or Hooks()
    setup_torch(config)
    policy = policy or load_policy(config, reference=config.teacher == "frozen")
    optimizer = make_optimizer(policy, config)
    prompts = PromptCache(policy.tokenizer)
    result = TrainResult(status="finished", step=0)
    state: dict = {"history": [], "evals": [], "start_length": None, "start_canary": None, "breaches": []}
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None:
        saved = load_checkpoint(checkpoint, policy=policy, optimizer=optimizer)
        result.step, state = saved["step"], saved["state"]
        hooks.emit("log", f"resumed from {checkpoint.name}")
    elif eval_items and eval_score:
        _eval(state, 0, policy, eval_items, eval_score, config, prompts, hooks)

    for step in range(result.step + 1, config.steps + 1):
        if hooks.stop_requested():
            checkpoint_save(run_dir, policy, optimizer, step - 1, config, state, hooks)
            result.status = "cancelled"
            break
        started = time.perf_counter()
        hooks.emit("on_phase", "sampling", step, config.steps)
        batch = batch_for_step(items, step=step, size=config.prompts_per_step, seed=config.seed)

        # Rollout: the student answers without the hint.
        rollout = sample(
            policy.model,
            policy.tokenizer,
            [prompts.get(it) for it in batch],
            num_samples=config.samples_per_prompt,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
        )
        width = rollout.response_mask.shape[1]
        mask = rollout.response_mask.float()

        # The teacher reads the same response tokens after the context *with* the hint.
        teacher_prompts = [
            prompts.get(
                it, variant="hint", messages=with_hint(it.messages, config.hint_template.format(feedback=it.feedback))
            )
            for it in batch
        ]
        t_ids, t_attn = left_pad(
            [p for p in teacher_prompts for _ in range(config.samples_per_prompt)], policy.tokenizer.pad_token_id
        )
        t_ids = torch.cat([t_ids.to(policy.device), rollout.response_ids], dim=1)
        t_attn = torch.cat([t_attn.to(policy.device), rollout.response_mask], dim=1)
        with torch.no_grad():
            if config.teacher == "frozen":
                with policy.as_reference() as teacher:
                    teacher_logits = forward_logits(teacher, t_ids, t_attn, keep=width)
            else:
                teacher_logits = forward_logits(policy.model, t_ids, t_attn, keep=width)

        # Update: reverse KL(student ‖ teacher) on the student's tokens.
        hooks.emit("on_phase", "update", step, config.steps)
        student_logits = forward_logits(policy.model, rollout.input_ids, rollout.attention_mask, keep=width)
        loss = L.distill_kl(student_logits, teacher_logits, mask)
        loss_value = finite_check(float(loss.detach()), what="loss", step=step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), config.max_grad_norm)
        grad_norm = finite_check(float(norm), what="gradient norm", step=step)
        optimizer.step()

        metrics = {
            "step": step,
            "loss": loss_value,
            "teacher_kl": loss_value,  # the loss is the KL to the hinted teacher, not to the start
            "grad_norm": grad_norm,
            "generated_tokens": int(rollout.lengths.sum()),
            "step_seconds": time.perf_counter() - started,
            **rollout_stats(rollout),
        }
        if state["start_length"] is None:
            state["start_length"] = metrics["response_length"]
        state["history"].append(metrics)
        result.step = step
        hooks.emit("on_step", step, metrics)
        if config.samples_every and (step == 1 or step % config.samples_every == 0):
            hooks.emit(
                "on_samples",
                step,
                [
                    {"item": batch[k // config.samples_per_prompt].id, "response": t[:4000], "reward": None}
                    for k, t in enumerate(rollout.texts)
                ],
            )
        if eval_items and eval_score and config.eval_every and (step % config.eval_every == 0 or step == config.steps):
            _eval(state, step, policy, eval_items, eval_score, config, prompts, hooks)
        breaches = monitors.check(config.monitors, history=state["history"], start_length=state["start_length"])
        if step_close(run_dir, policy, optimizer, step, config, state, hooks, breaches):
            result.status = "stopped"
            break

    return result_close(result, state, policy, run_dir, export, hooks)


def sft_train(
    *,
    config: SFTConfig,
    items: list[TurnItem],
    run_dir: Path,
    eval_items: list[TurnItem] | None = None,
    eval_score: Scorer | None = None,
    hooks: Hooks | None = None,
    policy: Policy | None = None,
    export: bool = True,
) -> TrainResult:
    """Supervised fine-tuning on each item's `target` (a corrected response); the loss is
    the token-mean negative log-likelihood of the target given the logged context."""
    items = [it for it in items if it.target]
    if not items:
        raise ValueError("no item has a corrected response to train on")
    hooks = hooks or Hooks()
    setup_torch(config)
    policy = policy or load_policy(config)
    optimizer = make_optimizer(policy, config)
    prompts = PromptCache(policy.tokenizer)
    eos = [policy.tokenizer.eos_token_id]
    result = TrainResult(status="finished", step=0)
    state: dict = {"history": [], "evals": [], "start_length": None, "start_canary": None, "breaches": []}
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is not None:
        saved = load_checkpoint(checkpoint, policy=policy, optimizer=optimizer)
        result.step, state = saved["step"], saved["state"]
        hooks.emit("log", f"resumed from {checkpoint.name}")
    elif eval_items and eval_score:
        _eval(state, 0, policy, eval_items, eval_score, config, prompts, hooks)

    for step in range(result.step + 1, config.steps + 1):
        if hooks.stop_requested():
            checkpoint_save(run_dir, policy, optimizer, step - 1, config, state, hooks)
            result.status = "cancelled"
            break
        started = time.perf_counter()
        hooks.emit("on_phase", "update", step, config.steps)
        batch = batch_for_step(items, step=step, size=config.prompts_per_step, seed=config.seed)
        targets = [encode_target(policy.tokenizer, it.target or "") for it in batch]
        layout = rollout_from_tokens(
            [prompts.get(it) for it in batch],
            targets,
            num_samples=1,
            eos_ids=eos,
            pad_id=policy.tokenizer.pad_token_id,
            texts=[it.target or "" for it in batch],
            device=policy.device,
        )
        mask = layout.response_mask.float()
        logprobs = token_logprobs(policy.model, layout.input_ids, layout.attention_mask, keep=mask.shape[1])
        loss = L.sft_loss(logprobs, mask, config.first_token_weight)
        loss_value = finite_check(float(loss.detach()), what="loss", step=step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), config.max_grad_norm)
        grad_norm = finite_check(float(norm), what="gradient norm", step=step)
        optimizer.step()
        metrics = {
            "step": step,
            "loss": loss_value,
            "grad_norm": grad_norm,
            "response_length": fmean(layout.lengths.float().tolist()),
            "step_seconds": time.perf_counter() - started,
        }
        state["history"].append(metrics)
        result.step = step
        hooks.emit("on_step", step, metrics)
        if eval_items and eval_score and config.eval_every and (step % config.eval_every == 0 or step == config.steps):
            _eval(state, step, policy, eval_items, eval_score, config, prompts, hooks)
        step_close(run_dir, policy, optimizer, step, config, state, hooks)

    return result_close(result, state, policy, run_dir, export, hooks)


def _eval(state, step, policy, eval_items, score, config, prompts, hooks) -> None:
    def progress(done: int, total: int) -> None:
        hooks.emit("on_phase", "evaluation", done, total)

    progress(0, len(eval_items))
    metrics = {"step": step, **evaluate(policy, eval_items, score, config=config, prompts=prompts, progress=progress)}
    state["evals"].append(metrics)
    hooks.emit("on_eval", step, metrics)
