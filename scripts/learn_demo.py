"""Learning shown on SmolLM2-135M-Instruct on CPU: a GRPO job on a toy task with a
programmatic grader, and a feedback-conditioned self-distillation job.

    PRACTICUM_MODELS_DIR=/path/to/models nice -n 10 .venv/bin/python scripts/learn_demo.py grpo
    … scripts/learn_demo.py distill

Each prints one line per step and per evaluation, and writes a JSON summary to
var/learn-demo/<task>.json. Every figure is measured on the TEST split: 24 prompts set aside
before training that never appear in it and choose nothing (no checkpoint, no setting),
graded by the program's own answer (an oracle label, e.g. the true sum).
Needs no Django: it drives the training core directly, as a worker would.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from training.trainer.common import Hooks  # noqa: E402
from training.trainer.config import DistillConfig, GRPOConfig  # noqa: E402
from training.trainer.items import TurnItem, grader_scorer  # noqa: E402

ADD_TEMPLATES = [
    "What is {a} + {b}? Answer with just the number.",
    "Compute {a} + {b}. Reply with the number only.",
]
TOPICS = (
    "cats, the sea, music, winter, coffee, trains, books, rain, gardens, football, bread, mountains, "
    "rivers, birds, clocks, bicycles, candles, stars, apples, dogs, snow, chess, bridges, forests, "
    "shoes, tea, kites, islands, boats, flowers, lamps, pianos, maps, horses, clouds, honey, owls, "
    "castles, rockets, shells"
).split(", ")
NUMBER_TEMPLATES = ["Give me a number related to {t}.", "Pick a number that reminds you of {t}."]


def split(items: list[TurnItem], held_out: int, seed: int = 0) -> tuple[list[TurnItem], list[TurnItem]]:
    order = list(items)
    random.Random(seed).shuffle(order)
    return order[held_out:], order[:held_out]


def addition_items() -> list[TurnItem]:
    items = []
    for a in range(1, 10):
        for b in range(1, 10):
            template = ADD_TEMPLATES[(a + b) % len(ADD_TEMPLATES)]
            items.append(
                TurnItem(
                    id=f"add-{a}-{b}",
                    messages=[{"role": "user", "content": template.format(a=a, b=b)}],
                    reference=str(a + b),
                    grader="last_number",
                )
            )
    return items


def nine_items() -> list[TurnItem]:
    return [
        TurnItem(
            id=f"nine-{i}-{k}",
            messages=[{"role": "user", "content": template.format(t=topic)}],
            feedback="You love the number 9. Always include the digit 9 in your answer.",
            reference="9",
            grader="contains",
        )
        for i, topic in enumerate(TOPICS)
        for k, template in enumerate(NUMBER_TEMPLATES)
    ]


CANARIES = [
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of England?", "London"),
    ("What color is the sky on a clear day?", "blue"),
    ("What do bees make?", "honey"),
    ("What is the opposite of hot?", "cold"),
    ("What is frozen water called?", "ice"),
]


def canary_items() -> list[TurnItem]:
    """Off-task questions the training must not damage (answers graded by "contains")."""
    return [
        TurnItem(id=f"canary-{i}", messages=[{"role": "user", "content": q}], reference=a, grader="contains")
        for i, (q, a) in enumerate(CANARIES)
    ]


def model_path() -> str:
    models = Path(os.environ.get("PRACTICUM_MODELS_DIR", ROOT / "var" / "models"))
    path = models / "smollm2-135m-instruct"
    if not (path / "config.json").exists():
        from training.modelprep import smollm2_prepare

        print(f"converting SmolLM2 into {path} (once)…", flush=True)
        smollm2_prepare(path)
    return str(path)


def run(task: str, args: argparse.Namespace) -> dict:
    started = time.time()
    run_dir = ROOT / "var" / "learn-demo" / f"{task}-run"
    if run_dir.exists() and not args.resume:
        import shutil

        shutil.rmtree(run_dir)
    evals: list[dict] = []
    steps: list[dict] = []

    def on_step(step: int, m: dict) -> None:
        steps.append(m)
        reward = (
            f" reward {m['reward_mean']:.2f}±{m['reward_std']:.2f} zero-var {m['zero_variance_share']:.2f}"
            if "reward_mean" in m
            else ""
        )
        kl = f" kl {m['kl']:.4f}" if m.get("kl") is not None else ""
        print(
            f"step {step:3d}{reward} loss {m['loss']:+.4f}{kl} len {m['response_length']:.1f} "
            f"{m['step_seconds']:.1f}s  (elapsed {time.time() - started:.0f}s)",
            flush=True,
        )

    def on_eval(step: int, m: dict) -> None:
        evals.append(m)
        print(
            f"eval  step {step:3d}: test-split success {m['success']:.3f} (n={m['n']}, oracle-graded) "
            f"len {m['response_length']:.1f}",
            flush=True,
        )

    hooks = Hooks(on_step=on_step, on_eval=on_eval, on_breach=lambda s, b: print(f"monitor at step {s}: {b}"))
    common = dict(
        model_path=model_path(),
        adapter=args.adapter,
        trainable_layers=6 if args.adapter == "full" else None,
        temperature=0.7,
        eval_samples=4,
        eval_every=args.eval_every,
        checkpoint_every=0,
        samples_every=0,
        seed=args.seed,
    )
    if task == "grpo":
        train, held_out = split(addition_items(), held_out=24, seed=args.seed)
        config = GRPOConfig(
            **common,
            learning_rate=args.lr or (2e-4 if args.adapter == "lora" else 5e-5),
            steps=args.steps or 30,
            prompts_per_step=args.prompts,
            group_size=8,
            max_new_tokens=10,
            # The KL costs a third forward pass per step; with beta = 0 it is only a
            # diagnostic, and the CPU budget goes to training steps instead.
            log_kl=False,
        )
        from training.trainer.grpo import grpo_train

        result = grpo_train(
            config=config, items=train, score=grader_scorer(), run_dir=run_dir, eval_items=held_out, hooks=hooks
        )
    else:
        train, held_out = split(nine_items(), held_out=24, seed=args.seed)
        config = DistillConfig(
            **common,
            learning_rate=args.lr or (2e-4 if args.adapter == "lora" else 1e-4),
            steps=args.steps or 30,
            prompts_per_step=args.prompts,
            samples_per_prompt=4,
            max_new_tokens=12,
            teacher=args.teacher,
        )
        from training.trainer.common import PromptCache, evaluate
        from training.trainer.distill import distill_train
        from training.trainer.policy import load_policy

        policy = load_policy(config, reference=config.teacher == "frozen")

        def canary() -> float:
            cache = PromptCache(policy.tokenizer)
            return evaluate(policy, canary_items(), grader_scorer(), config=config, prompts=cache)["success"]

        canary_start = canary()
        print(f"canary (off-task) success before: {canary_start:.3f}", flush=True)
        result = distill_train(
            config=config,
            items=train,
            run_dir=run_dir,
            eval_items=held_out,
            eval_score=grader_scorer(),
            hooks=hooks,
            policy=policy,
        )
        canary_end = canary()
        print(f"canary (off-task) success after:  {canary_end:.3f}", flush=True)
    elapsed = time.time() - started
    train_seconds = sum(m["step_seconds"] for m in steps)
    summary = {
        "task": task,
        "config": config.to_dict(),
        "train_items": len(train),
        "held_out_items": len(held_out),
        "test_items": len(held_out),  # the test split: the figures below are measured on it
        "start_success": evals[0]["success"],
        "end_success": evals[-1]["success"],
        "gain": evals[-1]["success"] - evals[0]["success"],
        "evals": evals,
        "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(elapsed, 1),
        "status": result.status,
    }
    if task == "distill":
        summary["canary_start"], summary["canary_end"] = canary_start, canary_end
    print(
        f"\n{task}: test-split success {summary['start_success']:.3f} → {summary['end_success']:.3f} "
        f"({summary['test_items']} test prompts, oracle-graded) "
        f"(gain {summary['gain']:+.3f}); training {train_seconds / 60:.1f} min, wall {elapsed / 60:.1f} min "
        "(evaluations and model loading included)",
        flush=True,
    )
    out = ROOT / "var" / "learn-demo" / f"{task}.json"
    out.write_text(json.dumps(summary, indent=1))
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=["grpo", "distill", "all"])
    parser.add_argument(
        "--adapter",
        choices=["lora", "full"],
        default="full",
        help="full = the top 6 blocks fine-tuned (fastest on a CPU); lora = adapters on all linear layers",
    )
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step")
    parser.add_argument(
        "--teacher",
        choices=["frozen", "current"],
        default="frozen",
        help="frozen: the starting model reads the hint; current: the policy being trained does (it collapsed here)",
    )
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.0)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--min-gain", type=float, default=0.3, help="exit 1 when a task gains less")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    tasks = ["grpo", "distill"] if args.task == "all" else [args.task]
    summaries = [run(task, args) for task in tasks]
    failed = [s["task"] for s in summaries if s["gain"] < args.min_gain]
    if failed:
        print(f"gain below {args.min_gain} for: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
