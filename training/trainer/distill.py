"""Self-distillation: SFT on corrected responses, and feedback-conditioned on-policy
distillation (teacher = the policy with the feedback as a system hint, student = the
policy without it, per-token reverse KL on the student's own samples).

Each is a step (`distill_step`, `sft_step`) that reads top to bottom like GRPO's,
run by `run.run_training` with its checkpoint/resume, callbacks, evaluations and
monitors."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from training.trainer import loss as L
from training.trainer.common import Hooks, PromptCache, evaluate, rollout_stats
from training.trainer.config import DistillConfig, SFTConfig, TrainConfig
from training.trainer.items import Scorer, TurnItem, with_hint
from training.trainer.logprobs import forward_logits, token_logprobs
from training.trainer.parallel import item_generators, rollout_seen
from training.trainer.policy import Policy
from training.trainer.run import (
    EvalFn,
    RunState,
    StepFn,
    StepOutput,
    Trainer,
    TrainResult,
    run_training,
    trainer_setup,
    turn_monitors,
)
from training.trainer.sampling import encode_target, left_pad, rollout_from_tokens, sample


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
    trainer = trainer_setup(config, policy=policy, reference=config.teacher == "frozen")
    prompts = PromptCache(trainer.policy.tokenizer)
    return run_training(
        trainer,
        items=items,
        step=distill_step(trainer, prompts=prompts, hooks=hooks),
        run_dir=run_dir,
        hooks=hooks,
        evaluate=_evaluation(trainer.policy, eval_items, eval_score, config, prompts, hooks),
        monitor=turn_monitors(config),
        export=export,
    )


def distill_step(trainer: Trainer, *, prompts: PromptCache, hooks: Hooks) -> StepFn:
    """Step n of on-policy distillation: the student samples without the hint, the
    teacher scores the same tokens with it, the loss is the reverse KL between them."""
    config, policy = trainer.config, trainer.policy
    per_prompt = config.samples_per_prompt

    def step(n: int, batch: list[TurnItem], started: float) -> StepOutput:

        # Rollout: the student answers without the hint.
        rollout = sample(
            policy.model,
            policy.tokenizer,
            [prompts.get(it) for it in batch],
            num_samples=per_prompt,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            generators=item_generators(trainer.ranks, seed=config.seed, step=n, count=len(batch)),
        )
        width = rollout.response_mask.shape[1]
        mask = rollout.response_mask.float()

        # The teacher reads the same response tokens after the context *with* the hint.
        teacher_prompts = [
            prompts.get(
                it,
                variant=f"hint-{config.hint_at}",
                messages=with_hint(it.messages, config.hint_template.format(feedback=it.feedback), at=config.hint_at),
            )
            for it in batch
        ]
        t_ids, t_attn = left_pad([p for p in teacher_prompts for _ in range(per_prompt)], policy.tokenizer.pad_token_id)
        t_ids = torch.cat([t_ids.to(policy.device), rollout.response_ids], dim=1)
        t_attn = torch.cat([t_attn.to(policy.device), rollout.response_mask], dim=1)
        with torch.no_grad():
            if config.teacher == "frozen":
                with policy.as_reference() as teacher:
                    teacher_logits = forward_logits(teacher, t_ids, t_attn, keep=width)
            else:
                teacher_logits = forward_logits(policy.model, t_ids, t_attn, keep=width)

        # Update: reverse KL(student ‖ teacher) on the student's tokens.
        hooks.emit("on_phase", "update", n, config.steps)
        student_logits = forward_logits(policy.model, rollout.input_ids, rollout.attention_mask, keep=width)
        loss = L.distill_kl(student_logits, teacher_logits, mask)
        loss_value, grad_norm = trainer.loss_step(loss, step=n, share=trainer.share(float(mask.sum())))
        seen = rollout_seen(trainer.ranks, rollout)  # the figures are the global batch's
        metrics = {
            "step": n,
            "loss": loss_value,
            "teacher_kl": loss_value,  # the loss is the KL to the hinted teacher, not to the start
            "grad_norm": grad_norm,
            "generated_tokens": int(seen.lengths.sum()),
            "step_seconds": time.perf_counter() - started,
            **rollout_stats(seen),
        }

        def samples() -> list[dict]:
            return [
                {"item": batch[k // per_prompt].id, "response": t[:4000], "reward": None}
                for k, t in enumerate(rollout.texts)
            ]

        return StepOutput(metrics, samples=samples)

    return step


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
    the token-mean negative log-likelihood of the target given the logged context. No
    monitors: the targets are fixed, so there is no sampling to be gamed."""
    items = [it for it in items if it.target]
    if not items:
        raise ValueError("no item has a corrected response to train on")
    hooks = hooks or Hooks()
    trainer = trainer_setup(config, policy=policy, reference=False)
    prompts = PromptCache(trainer.policy.tokenizer)
    return run_training(
        trainer,
        items=items,
        step=sft_step(trainer, prompts=prompts, hooks=hooks),
        first_phase="update",
        run_dir=run_dir,
        hooks=hooks,
        evaluate=_evaluation(trainer.policy, eval_items, eval_score, config, prompts, hooks),
        export=export,
    )


def sft_step(trainer: Trainer, *, prompts: PromptCache, hooks: Hooks) -> StepFn:
    """Step n of SFT: the batch's targets after their contexts, the weighted NLL."""
    config, policy = trainer.config, trainer.policy
    eos = [policy.tokenizer.eos_token_id]

    def step(n: int, batch: list[TurnItem], started: float) -> StepOutput:
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
        share = trainer.share(float(L.sft_token_weights(mask, config.first_token_weight).sum()))
        loss_value, grad_norm = trainer.loss_step(loss, step=n, share=share)
        lengths, rows = trainer.ranks.sum(float(layout.lengths.sum()), len(batch))
        metrics = {
            "step": n,
            "loss": loss_value,
            "grad_norm": grad_norm,
            "response_length": lengths / rows,
            "step_seconds": time.perf_counter() - started,
        }
        return StepOutput(metrics)

    return step


def _evaluation(
    policy: Policy,
    eval_items: list[TurnItem] | None,
    score: Scorer | None,
    config: TrainConfig,
    prompts: PromptCache,
    hooks: Hooks,
) -> EvalFn | None:
    """Compliance on `eval_items` by `score`, without the hint; None when there is
    nothing to evaluate or nothing to score it with."""
    if not (eval_items and score):
        return None

    def progress(done: int, total: int) -> None:
        hooks.emit("on_phase", "evaluation", done, total)

    def evaluate_now(step: int, state: RunState) -> dict:
        progress(0, len(eval_items))
        return {"step": step, **evaluate(policy, eval_items, score, config=config, prompts=prompts, progress=progress)}

    return evaluate_now
