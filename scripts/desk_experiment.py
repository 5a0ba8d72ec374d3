"""Support-desk recipes side by side, on SmolLM2-135M on the CPU: chosen on the VALIDATION
split, then measured once on the TEST split.

    X="nice -n 10 .venv/bin/python scripts/desk_experiment.py"
    $X base --seed 0                                  # validation (32 episodes)
    $X run --recipe cf3-near3 --seed 0                # train; checkpoint and figures on validation
    $X curve --recipe cf3-near3 --seed 0              # its decision curve on validation contexts
    $X measure --recipe cf3-near3 --seed 0 --split test --episodes 48 --fresh-seed 2   # the one look
    $X base --seed 0 --split test --episodes 48 --fresh-seed 2
    .venv/bin/python scripts/desk_experiment.py summary

A measurement of the test split (or a fresh slice) is a look: refused for a recipe family
and seed already measured there unless `--second-look REASON`, and logged in
docs/experiments/test-split-looks.jsonl.

Every run appends one JSON line to var/desk-experiment/runs.jsonl (the recipe, its
settings, the training history and each measurement), so partial results survive a stop.

What is trained: SFT on oracle labels — the turns of training-split tasks played by the
hidden policy itself (`oracle_turns`: the context at each point of the conversation and
the corrected response `turn_target` renders over the order the customer named and what
its lookup showed). No test or validation order, id, customer or wording is in a
training set.

What is measured: episodes of the support desk played by the model with the agent's
harness (the same tool-call regex the demo agent asks vLLM to enforce, here enforced
token by token in torch; temperature 0.7; each episode seeded), on tasks of the TEST split
(or of a freshly generated slice, `--fresh-seed`): the success rate, the share of episodes
that changed another customer's order (collateral changes, from the episode's audit),
the share that called a tool on an id the conversation never showed, and the share whose
first tool call named another order than the customer's.

Recipes (`RECIPES`): `memorise` is the failure mode: a few orders, many steps.
`templates` trains on every training order once per pass; `-es` adds early stopping on
the validation split's turns; `-r4` a lower LoRA rank and fewer steps; `-mix` mixes in
the base model's own answers on other turns (the training split's tracking questions);
`decisions-es` weights the turns where the policy decides (after the lookup);
`decisions-weighted-32` also weights each target's first token (the action) 32 times, and
`-cf3` adds 3 counterfactual copies of each decision point (`counterfactual_turns`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The parts (scripts/desk/) after the environment above: what they import inside their
# functions (torch, Django) then finds it set.
from desk import OUT, log  # noqa: E402
from desk.curve import command_curve, command_decisions  # noqa: E402
from desk.harness import MAX_TURN_TOKENS, MODEL, TEMPERATURE, Harness, cpu_attention, load_base  # noqa: E402
from desk.items import note_items, note_turn, words_only_check  # noqa: E402
from desk.measure import eval_tasks, measure, slim  # noqa: E402
from desk.recipes import BASE_RECIPE, RECIPES  # noqa: E402
from desk.summary import summary_print  # noqa: E402
from desk.train import train  # noqa: E402

# What other scripts (`import desk_experiment as desk`) and the tests read from here.
__all__ = [
    "BASE_RECIPE",
    "MAX_TURN_TOKENS",
    "MODEL",
    "RECIPES",
    "TEMPERATURE",
    "Harness",
    "cpu_attention",
    "eval_tasks",
    "load_base",
    "log",
    "measure",
    "note_items",
    "note_turn",
    "slim",
    "summary_print",
    "train",
    "words_only_check",
]


def append(record: dict[str, Any]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "runs.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")


def slices(args, family: str) -> list[tuple[str, int | None]]:
    """(split, fresh seed) of each measurement the command asks for. A measurement of the
    test split or a fresh slice is a look at held-out figures: refused when `family` was
    already measured there for this seed (without `--second-look REASON`), else logged in
    docs/experiments/test-split-looks.jsonl."""
    from training.promotion.evaluation.split_looks import SecondLook, split_look_check, split_look_record

    wanted = [] if args.only_fresh else [(args.split, None)]
    wanted += [("fresh", f) for f in args.fresh_seed]
    if args.episodes > 0 and any(split != "validation" for split, _ in wanted):
        try:
            split_look_check(family=family, seeds=[args.seed], reason=args.second_look)
        except SecondLook as exc:
            raise SystemExit(str(exc)) from None
        split_look_record(
            family=family,
            script="scripts/desk_experiment.py",
            argv=sys.argv[1:],
            seeds=[args.seed],
            reason=args.second_look,
        )
    return wanted


def command_base(args) -> None:
    model, tokenizer = load_base()
    harness = Harness(model, tokenizer)
    for split, fresh in slices(args, "base"):
        tasks = eval_tasks(split=split, episodes=args.episodes, seed=args.seed, fresh_seed=fresh)
        label = f"base {split}{'' if fresh is None else f' {fresh}'} seed {args.seed}"
        result = measure(harness, tasks, seed=args.seed, label=label)
        log(f"{label}: {json.dumps(slim(result))}")
        append(
            {
                "kind": "base",
                "seed": args.seed,
                "split": split,
                "fresh_seed": fresh,
                "measure": result,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )


def command_run(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    recipe = {**BASE_RECIPE, **RECIPES[args.recipe]}
    for key in ("steps", "lora_rank", "orders", "first_token_weight", "learning_rate", "variants"):
        if getattr(args, key) is not None:
            recipe[key] = getattr(args, key)
    wanted = slices(args, args.recipe)  # a refused look stops here, before the training
    run_dir = OUT / "runs" / f"{args.recipe}-seed{args.seed}-{int(time.time())}"
    log(f"recipe {args.recipe} seed {args.seed}: {recipe}")
    policy, info = train(recipe, seed=args.seed, run_dir=run_dir)
    log(f"trained: {json.dumps({k: v for k, v in info.items() if k != 'validation'})}")
    policy.model.save_pretrained(run_dir / "adapter")  # the kept adapter, to measure it again
    info["adapter"] = str(run_dir / "adapter")
    measures = measure_all(args, Harness(policy.model, policy.tokenizer), args.recipe, wanted)
    append(
        {
            "kind": "candidate",
            "recipe": args.recipe,
            "settings": recipe,
            "seed": args.seed,
            "train": info,
            "measures": measures,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    )


def measure_all(args, harness: Harness, family: str, wanted: list[tuple[str, int | None]]) -> dict[str, Any]:
    """The command's measurements of one model on the `wanted` slices (see `slices`), by
    slice ("validation", "test", "fresh-F")."""
    measures = {}
    for split, fresh in wanted:
        if args.episodes <= 0:
            continue
        tasks = eval_tasks(split=split, episodes=args.episodes, seed=args.seed, fresh_seed=fresh)
        label = f"{family} {split}{'' if fresh is None else f' {fresh}'} seed {args.seed}"
        try:
            result = measure(harness, tasks, seed=args.seed, label=label)
        except Exception as exc:  # keep the other measurements and the training record
            log(f"{label} failed: {exc!r}")
            continue
        log(f"{label}: {json.dumps(slim(result))}")
        measures[split if fresh is None else f"fresh-{fresh}"] = result
    return measures


def command_measure(args) -> None:
    """A trained run's kept adapter measured again (after the recipe was chosen on the
    validation split: its one look at the test split), recorded as that run's candidate."""
    from peft import PeftModel

    runs = [json.loads(line) for line in (OUT / "runs.jsonl").read_text().splitlines() if line.strip()]
    run = next(
        (
            r
            for r in reversed(runs)
            if r["kind"] == "candidate" and r["recipe"] == args.recipe and r["seed"] == args.seed
        ),
        None,
    )
    if run is None:
        raise SystemExit(f"no run of {args.recipe} with seed {args.seed} in {OUT / 'runs.jsonl'}")
    wanted = slices(args, args.recipe)
    model, tokenizer = load_base()
    model = PeftModel.from_pretrained(model, run["train"]["adapter"]).eval()
    measures = measure_all(args, Harness(model, tokenizer), args.recipe, wanted)
    append({**run, "measures": measures, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


def command_summary(args) -> None:
    path = args.runs
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    summary_print(records)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("base", "run", "measure"):
        p = sub.add_parser(name)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--episodes", type=int, default=32, help="episodes per measurement")
        p.add_argument(
            "--split",
            default="validation",
            choices=["validation", "test"],
            help="validation to choose; test once per recipe family and seed (each look logged)",
        )
        p.add_argument("--fresh-seed", type=int, action="append", default=[], help="also measure this fresh slice")
        p.add_argument("--only-fresh", action="store_true", help="measure the fresh slices only")
        p.add_argument("--second-look", default="", metavar="REASON", help="measure the test split again, and why")
        if name == "measure":
            p.add_argument("--recipe", choices=sorted(RECIPES), required=True)
        if name == "run":
            p.add_argument("--recipe", choices=sorted(RECIPES), required=True)
            p.add_argument("--steps", type=int)
            p.add_argument("--lora-rank", dest="lora_rank", type=int)
            p.add_argument("--orders", type=int)
            p.add_argument("--first-token-weight", dest="first_token_weight", type=float)
            p.add_argument("--lr", dest="learning_rate", type=float)
            p.add_argument("--variants", type=int, help="counterfactual copies of each decision point")
            p.add_argument("--threads", type=int, default=1, help="torch threads")
    decisions = sub.add_parser("decisions", help="P(refund) after a lookup, per kind of order")
    decisions.add_argument("--adapter", default="", help="a run's adapter folder (default: the base model)")
    decisions.add_argument("--turns", type=int, default=40)
    decisions.add_argument(
        "--split", default="validation", choices=["validation", "test"], help="the held-out split beside train"
    )
    decisions.add_argument(
        "--hint", action="store_true", help="print how much the simulated lead's comment as a hint moves P(refund)"
    )
    decisions.add_argument("--hint-at", choices=["system", "last"], default="system", help="where the hint goes")
    curve = sub.add_parser("curve", help="P(refund) after a lookup by days since delivery (the decision curve)")
    curve.add_argument("--adapter", default="", help="an adapter folder (default: the base model)")
    curve.add_argument("--recipe", default="", help="or the kept adapter of this recipe's run with --seed")
    curve.add_argument("--seed", type=int, default=0)
    curve.add_argument("--split", default="validation", choices=["validation", "test"])
    curve.add_argument("--per-point", dest="per_point", type=int, default=2)
    curve.add_argument("--every", type=int, default=2, help="every N-th day (and 30, 31)")
    summary = sub.add_parser("summary")
    summary.add_argument("--runs", type=Path, default=OUT / "runs.jsonl", help="the runs' record (JSONL)")
    args = parser.parse_args()
    if args.command == "summary":
        command_summary(args)
        return 0
    import django

    django.setup()
    import torch

    torch.set_num_threads(1)
    cpu_attention()
    commands = {
        "base": command_base,
        "run": command_run,
        "measure": command_measure,
        "decisions": command_decisions,
        "curve": command_curve,
    }
    commands[args.command](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
