"""What hinted GRPO costs and does per step, by `hint_samples` K, on the tiny random model.

Turn-level GRPO, G = 8 samples for each of 4 prompts a step, 32 new tokens, one torch
thread, every item with a comment. The reward is a rule the random model meets by chance
(a response whose length in characters is a multiple of 10, about one in ten), so some groups have no
variance and get hinted. It measures the mechanics, not learning: the tiny model cannot
read a hint, so any change the hint makes to its distribution is noise.

    .venv/bin/python bench/hinted_grpo.py [--hints 0 4 8] [--steps 6]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from statistics import fmean

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def score(item, candidates: list[str]) -> list[float]:
    return [float(len(c) % 10 == 0) for c in candidates]


def run(model_dir: Path, run_dir: Path, *, hints: int, steps: int) -> dict:
    import torch

    from training.trainer.config import GRPOConfig
    from training.trainer.grpo import grpo_train
    from training.trainer.items import TurnItem

    torch.set_num_threads(1)
    items = [
        TurnItem(
            id=f"q{i}",
            messages=[{"role": "user", "content": f"Where is order A{1000 + i}?"}],
            feedback="Apologise, then give the tracking number.",
        )
        for i in range(16)
    ]
    config = GRPOConfig(
        model_path=str(model_dir),
        steps=steps,
        prompts_per_step=4,
        group_size=8,
        max_new_tokens=32,
        eval_every=0,
        checkpoint_every=0,
        samples_every=0,
        log_kl=False,
        hint_samples=hints,
    )
    history = grpo_train(config=config, items=items, score=score, run_dir=run_dir, export=False).history

    def total(key: str) -> int:
        return sum(m.get(key) or 0 for m in history)

    weights = [m["hint_weight_mean"] for m in history if m.get("hint_weight_mean") is not None]
    truncated = [m["hint_truncated_share"] for m in history if m.get("hint_truncated_share") is not None]
    return {
        "K": hints,
        "step_s": fmean(m["step_seconds"] for m in history[1:] or history),  # the first warms up
        "groups": steps * config.prompts_per_step,
        "zero_var": sum(round(m["zero_variance_share"] * config.prompts_per_step) for m in history),
        "hinted": total("hinted_groups"),
        "gained": total("hinted_groups_with_variance"),
        "trained_rows": total("trained_sequences"),
        "weight_mean": fmean(weights) if weights else None,
        "truncated": fmean(truncated) if truncated else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hints", type=int, nargs="+", default=[0, 4, 8])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    from training.modelprep import tiny_prepare

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny_prepare(Path(tmp) / "tiny")
        print("K  step_s  groups  zero-var  hinted  gained  trained-rows  weight-mean  truncated")
        for k in args.hints:
            r = run(model_dir, Path(tmp) / f"run-{k}", hints=k, steps=args.steps)
            weight = "-" if r["weight_mean"] is None else f"{r['weight_mean']:.3f}"
            cut = "-" if r["truncated"] is None else f"{r['truncated']:.3f}"
            print(
                f"{r['K']:<2} {r['step_s']:6.2f}  {r['groups']:6}  {r['zero_var']:8}  {r['hinted']:6}  "
                f"{r['gained']:6}  {r['trained_rows']:12}  {weight:>11}  {cut:>9}"
            )


if __name__ == "__main__":
    main()
