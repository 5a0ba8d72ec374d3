"""Full-episode GRPO: the orchestrator runs G episodes of each task against the policy
being trained, the grader (optionally with a judge) rewards each whole episode, group
advantages compare the G episodes of a task, and the loss covers the model's own tokens
across all turns of each episode (prompts and tool results masked out).

`episode_step` is one step, top to bottom:
rollout (episodes) → reward → advantages → update → metrics; `run.run_training` runs
the steps (resume, evaluation, monitors, checkpoints, export). The episodes themselves
run in `episode_rollout`, the update in `episode_loss`. As in turn-level GRPO, the
reference's pass runs at the steps `GRPOConfig.reference_due` names: every step with β > 0
or a KL budget, else only at the steps that evaluate and the last one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from statistics import fmean, pstdev

import torch

from training.environments.base import Environment, Task
from training.environments.episodes import Episode
from training.trainer import monitors
from training.trainer.common import Hooks, finite_check, group_advantages_kept, phase_seconds
from training.trainer.config import EpisodesConfig
from training.trainer.episode_loss import episode_batch, episode_loss_backward
from training.trainer.episode_rollout import Generate, episodes_rollout, local_generate, vllm_generate
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
from training.trainer.sampling import eos_ids
from training.trainer.vllm_rollout import VllmRollouts

# judge(task, episodes) -> one score in [0, 1] per episode
EpisodeJudge = Callable[[Task, list[Episode]], list[float]]


def episode_rewards(
    episodes: list[Episode], *, judge_scores: list[float] | None, grader_weight: float, judge_weight: float
) -> list[float]:
    """r = (w_g · grade + w_j · judge) / (w_g + w_j), per episode; the grade alone when
    there are no judge scores or w_j = 0."""
    grades = [e.grade.reward for e in episodes]
    if not judge_scores or judge_weight <= 0:
        return grades
    total = grader_weight + judge_weight
    return [(grader_weight * g + judge_weight * j) / total for g, j in zip(grades, judge_scores, strict=True)]


def episode_stats(episodes: list[Episode]) -> dict[str, float]:
    """Per-step environment-fidelity figures, each a mean over episodes:

    - tool_error_rate: tool errors / tool calls of the episode (0 without calls);
    - budget_exhaustion: the step or token budget ended the episode;
    - early_stop: the episode ended on an answer without a single successful tool call;
    - episode_tokens, turns: the model's tokens and turns per episode;
    plus the turn-level monitors' inputs over all model turns (length, empty, truncated,
    tool-call blocks that did not parse)."""
    texts = [c.extra.get("text", "") for e in episodes for c in e.completions]
    seen, invalid = monitors.tool_call_validity(texts)
    turns = [c for e in episodes for c in e.completions]
    return {
        "tool_error_rate": fmean(e.tool_errors / e.tool_calls if e.tool_calls else 0.0 for e in episodes),
        "budget_exhaustion": fmean(1.0 if e.budget_exhausted else 0.0 for e in episodes),
        "early_stop": fmean(1.0 if e.end == "answered" and e.tool_calls == e.tool_errors else 0.0 for e in episodes),
        "episode_tokens": fmean(e.tokens for e in episodes),
        "turns": fmean(len(e.completions) for e in episodes),
        "response_length": fmean(c.tokens for c in turns) if turns else 0.0,
        "empty_share": fmean(1.0 if not (c.extra.get("text") or "").strip() else 0.0 for c in turns) if turns else 0.0,
        "truncated_share": fmean(1.0 if c.finish_reason == "length" else 0.0 for c in turns) if turns else 0.0,
        "tool_calls_seen": seen,
        "tool_calls_invalid": invalid,
    }


def success_of(reward: float) -> float:
    return 1.0 if reward >= 1.0 - 1e-9 else 0.0


def episodes_evaluate(
    env: Environment,
    tasks: list[Task],
    *,
    policy: Policy,
    config: EpisodesConfig,
    generate: Generate,
    stop_ids: set[int],
    progress: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, float], list[Episode]]:
    """Held-out success: `eval_samples` episodes per task, seeded (the global RNG for the
    local sampler, restored afterwards so evaluating does not change the training run; a
    per-request seed for a server's, so two evaluations of one model agree)."""
    cpu_state = torch.get_rng_state()
    torch.manual_seed(config.seed + 7919)
    try:
        episodes: list[Episode] = []
        per_call = max(1, config.eval_batch // max(1, config.eval_samples))
        for start in range(0, len(tasks), per_call):
            episodes += episodes_rollout(
                env,
                tasks[start : start + per_call],
                group_size=config.eval_samples,
                tokenizer=policy.tokenizer,
                generate=generate,
                stop_ids=stop_ids,
                max_steps=config.max_steps or None,
                max_tokens=config.max_episode_tokens or None,
                seed=config.seed + 7919,
                first_episode=len(episodes),
            )
            if progress is not None:
                progress(len(episodes), len(tasks) * config.eval_samples)
    finally:
        torch.set_rng_state(cpu_state)
    rewards = [e.reward for e in episodes]
    stats = episode_stats(episodes)
    metrics = {
        "reward": fmean(rewards),
        "success": fmean(success_of(r) for r in rewards),
        "n": len(rewards),
        "tool_error_rate": stats["tool_error_rate"],
        "budget_exhaustion": stats["budget_exhaustion"],
        "early_stop": stats["early_stop"],
        "episode_tokens": stats["episode_tokens"],
        "collateral_rate": fmean(1.0 if e.audit.collateral_changes else 0.0 for e in episodes),
        "unknown_id_rate": fmean(1.0 if e.audit.unknown_ids else 0.0 for e in episodes),
        "violation_rate": fmean(1.0 if e.audit.policy_violations else 0.0 for e in episodes),
    }
    return metrics, episodes


def episodes_train(
    *,
    config: EpisodesConfig,
    env: Environment,
    tasks: list[Task],
    run_dir: Path,
    eval_tasks: list[Task] | None = None,
    judge: EpisodeJudge | None = None,
    hooks: Hooks | None = None,
    policy: Policy | None = None,
    export: bool = True,
    vllm_api_key: str = "",
) -> TrainResult:
    """Train for `config.steps` steps on `tasks` of `env`, resuming from `run_dir`'s latest
    checkpoint if there is one. `hooks.on_episodes(step, phase, episodes)` receives every
    episode (phase "train" or "eval") so the caller can record them as traces.
    `vllm_api_key`: the inference server's key, for `rollout="vllm"`."""
    hooks = hooks or Hooks()
    if not tasks:
        raise ValueError("no training tasks")
    trainer = trainer_setup(config, policy=policy, reference=config.beta > 0 or config.log_kl)
    policy = trainer.policy
    stop_ids = set(eos_ids(policy.model, policy.tokenizer))
    if config.rollout == "vllm":
        server = VllmRollouts(base_url=config.vllm_url, run_dir=run_dir, api_key=vllm_api_key)
        generate = vllm_generate(server, policy, config)
    else:
        server = None
        generate = local_generate(policy, config)

    def evaluate_now(step: int, state: RunState) -> dict:
        if server is not None:
            server.load(policy, step=f"eval-{step}")
        hooks.emit("on_phase", "evaluation", 0, len(eval_tasks) * config.eval_samples)
        metrics, episodes = episodes_evaluate(
            env,
            eval_tasks,
            policy=policy,
            config=config,
            generate=generate,
            stop_ids=stop_ids,
            progress=lambda done, total: hooks.emit("on_phase", "evaluation", done, total),
        )
        metrics["step"] = step
        hooks.emit("on_episodes", step, "eval", episodes)
        return metrics

    def monitor(state: RunState) -> list[monitors.Breach]:
        # The turn-level monitors, the environment-fidelity guard and, on the evaluation
        # episodes, harm to records outside each task.
        breaches = turn_monitors(config)(state)
        breaches += monitors.fidelity(config.monitors, history=state.history)
        breaches += monitors.harm(config.monitors, evals=state.evals)
        return breaches

    step = episode_step(trainer, env, judge=judge, generate=generate, stop_ids=stop_ids, hooks=hooks, server=server)
    try:
        return run_training(
            trainer,
            items=tasks,
            step=step,
            run_dir=run_dir,
            hooks=hooks,
            evaluate=evaluate_now if eval_tasks else None,
            monitor=monitor,
            export=export,
        )
    finally:
        if server is not None:
            server.close()  # the job's last adapter leaves the server with it


def episode_step(
    trainer: Trainer,
    env: Environment,
    *,
    judge: EpisodeJudge | None,
    generate: Generate,
    stop_ids: set[int],
    hooks: Hooks,
    server,
) -> StepFn:
    """Step n of full-episode GRPO. `server` (a `VllmRollouts`): the current weights are
    loaded there as an adapter before the episodes run."""
    config, policy = trainer.config, trainer.policy
    group = config.group_size
    constant = config.prompts_per_step * group * (config.max_episode_tokens or env.max_tokens)

    def step(n: int, batch_tasks: list[Task], started: float) -> StepOutput:

        # Rollout: G episodes per task, each in its own sandbox.
        if server is not None:
            server.load(policy, step=str(n))
        episodes = episodes_rollout(
            env,
            batch_tasks,
            group_size=group,
            tokenizer=policy.tokenizer,
            generate=generate,
            stop_ids=stop_ids,
            max_steps=config.max_steps or None,
            max_tokens=config.max_episode_tokens or None,
        )
        sampled = time.perf_counter()

        # Reward: the grader's, optionally combined with a judge's score of each episode.
        judge_scores: list[float] | None = None
        if judge is not None and config.judge_weight > 0:
            judge_scores = []
            for k, task in enumerate(batch_tasks):
                judge_scores += [float(s) for s in judge(task, episodes[k * group : (k + 1) * group])]
        rewards = episode_rewards(
            episodes, judge_scores=judge_scores, grader_weight=config.grader_weight, judge_weight=config.judge_weight
        )
        scored = time.perf_counter()
        advantages, keep, kept = group_advantages_kept(rewards, groups=len(batch_tasks), config=config)
        rows = kept.tolist()

        # Update on the model's own tokens of every turn.
        hooks.emit("on_phase", "update", n, config.steps)
        loss_value = grad_norm = 0.0
        kl_value = None
        correction: dict[str, float] = {}
        if rows:
            batch = episode_batch(policy.tokenizer, episodes, rows, policy.tokenizer.pad_token_id)
            trainer.optimizer.zero_grad(set_to_none=True)
            out = episode_loss_backward(
                policy,
                batch,
                advantages.view(-1)[rows],
                config=config,
                constant=constant,
                micro_batch=config.micro_batch,
                reference=config.reference_due(n),
            )
            # Micro-batches are summed, so one non-finite loss among them shows here.
            loss_value, kl_value = finite_check(out["loss"], what="loss", step=n), out["kl"]
            correction = out["correction"]
            grad_norm = trainer.clip_and_step(step=n)
        finished = time.perf_counter()

        grades = [e.grade.reward for e in episodes]
        metrics = {
            "step": n,
            "reward_mean": fmean(rewards),
            "reward_std": pstdev(rewards),
            "grade_mean": fmean(grades),
            "success": fmean(success_of(g) for g in grades),
            "judge_mean": fmean(judge_scores) if judge_scores else None,
            "zero_variance_share": 1.0 - float(keep.float().mean()),
            "loss": loss_value,
            "kl": kl_value,
            "grad_norm": grad_norm,
            **correction,
            "trained_sequences": len(rows),
            "generated_tokens": sum(e.tokens for e in episodes),
            **phase_seconds(started, sampled, scored, finished),
            **episode_stats(episodes),
        }
        return StepOutput(metrics, episodes=episodes, samples=lambda: _sample_rows(episodes, rewards, advantages))

    return step


def _sample_rows(episodes: list[Episode], rewards: list[float], advantages: torch.Tensor) -> list[dict]:
    flat = advantages.view(-1).tolist()
    rows = []
    for k, e in enumerate(episodes):
        transcript = " ⏎ ".join(c.extra.get("text", "") for c in e.completions)
        rows.append(
            {
                "item": e.task.id,
                "prompt": e.task.prompt[:2000],
                "response": transcript[:4000],
                "reward": rewards[k],
                "advantage": round(flat[k], 4),
                "truncated": e.budget_exhausted,
                "reason": e.grade.reason,
            }
        )
    return rows
