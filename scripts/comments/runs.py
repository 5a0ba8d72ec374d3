"""A run: every seed's comments, arms and measurements, each appended to the runs' record;
and the record's tables."""

from __future__ import annotations

import contextlib
import fcntl
import json
import random
import time
from pathlib import Path
from typing import Any

from desk import log
from desk.harness import Harness, load_base
from desk.measure import eval_tasks, measure, slim
from desk.summary import latest_runs, summary_print

from comments.arms import arm_train
from comments.comment_set import comments_set
from comments.judge import JudgeServer
from comments.options import JUDGE_ARMS, Options
from training.promotion.evaluation.split_looks import SecondLook


def append(options: Options, record: dict[str, Any]) -> None:
    options.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    line = json.dumps({"run": options.run, "at": stamp, **record}, default=str) + "\n"
    with (options.out / "runs.jsonl").open("a") as f:
        # One seed's arms may run in processes of their own beside each other (`--arms`),
        # appending to the same log: a record of a few hundred kB must land whole, which
        # O_APPEND alone promises only for a write the kernel takes in one piece.
        fcntl.flock(f, fcntl.LOCK_EX)
        f.write(line)
        f.flush()


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
            # Whose words: the simulated lead's, or the bank's on the decision turns.
            "comments": options.comments,
            "episodes": comments["episodes"],
            "successes": comments["successes"],
        },
    )


def slices(options: Options) -> list[tuple[str, int | None]]:
    return [("test", None), *(("fresh", f) for f in options.fresh_seeds)]


def slice_key(split: str, fresh: int | None) -> str:
    return split if fresh is None else f"fresh-{fresh}"


def measures(
    harness: Harness, *, seed: int, options: Options, label: str, skip: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The test split and each fresh slice (but those in `skip`), played once each with the
    seed's sampling seeds."""
    out = {}
    for split, fresh in slices(options):
        key = slice_key(split, fresh)
        if key in skip:
            continue
        tasks = eval_tasks(split=split, episodes=options.test_episodes, seed=seed, fresh_seed=fresh)
        out[key] = measure(harness, tasks, seed=seed, label=f"{label} {key} seed {seed}")
        log(f"{label} {key} seed {seed}: {json.dumps(slim(out[key]))}")
    return out


def base_setup(options: Options) -> dict[str, Any]:
    """What a base measurement was taken with, as its record keeps it: a process reuses one
    only where the model and the episodes a slice are the same (`commit` is for the reader)."""
    return {"model": str(options.model), "test_episodes": options.test_episodes, "commit": options.commit}


def base_logged(options: Options, seed: int) -> dict[str, Any]:
    """The base's measurements of `seed` already in the run's log, by slice ("test",
    "fresh-3"), taken with this process's model and episodes a slice: another process of
    the same run measured them. A record that says no setup (written before records did)
    is not reused; a line that does not parse (a process killed as it wrote) is passed over."""
    path = options.out / "runs.jsonl"
    text = path.read_text() if path.exists() else ""
    mine = {k: v for k, v in base_setup(options).items() if k != "commit"}
    found: dict[str, Any] = {}
    for line in text.split("\n")[:-1]:
        try:
            r = json.loads(line) if line.strip() else {}
        except ValueError:
            continue
        setup = r.get("setup") or {}
        if (
            r.get("kind") == "base"
            and r.get("run") == options.run
            and r.get("seed") == seed
            and all(setup.get(k) == v for k, v in mine.items())
        ):
            found[slice_key(r["split"], r["fresh_seed"])] = r["measure"]
    return found


def base_measures(base: Harness, *, seed: int, options: Options) -> dict[str, Any]:
    """The base's slices of `seed` that this process must measure and log: those another
    process of the run logged already with the same setup (`base_logged`) are not played
    again, unless `options.base_again`, and the arms are paired with the logged ones. Every
    slice is played with the seed's own sampling seeds, so a process playing it again gets
    the same grades: where seeds 0 and 1 were played by two to four processes each, every
    grade was the same each time, and one final reply's words differed once (floating-point
    order on a differently loaded machine; `processes_agreement` reports it). A change to
    the code that plays the base between two processes of a run is not seen here: give
    `--measure-base-again` then."""
    logged = frozenset() if options.base_again else frozenset(base_logged(options, seed))
    if logged:
        log(f"base seed {seed}: {', '.join(sorted(logged))} from the run's log (--measure-base-again to play them)")
    return measures(base, seed=seed, options=options, label="base", skip=logged)


def look_family(arm: str, options: Options) -> str:
    """The recipe family an arm's test-split measurement is a look at: the arm with the
    settings that make it a recipe (A1: its oracle recipe; the others: whose words, how many
    steps), so a run of other settings is another family."""

    def steps(n: int) -> str:
        return f"{n} step{'' if n == 1 else 's'}"

    if arm == "oracle-sft":
        own = f", {steps(options.oracle_steps)}" if options.oracle_steps is not None else ""
        return f"lfc-oracle-sft ({options.oracle_recipe}{own})"
    return f"lfc-{arm} ({options.comments} comments, {steps(options.steps)})"


def looks_check(options: Options) -> None:
    """Refuse (`SecondLook`) a run before anything is played when an arm it would measure on
    the test split was measured there already for one of its seeds, unless
    `options.second_look` gives the reason. A run without a looks log (`--quick`, whose
    figures measure nothing) is not refused."""
    from training.promotion.evaluation.split_looks import split_look_check

    if options.looks_log is None:
        return
    for arm in options.arms:
        for seed in options.seeds:
            split_look_check(
                family=look_family(arm, options), seeds=[seed], reason=options.second_look, path=options.looks_log
            )


def look_take(options: Options, arm: str, seed: int) -> None:
    """Check and log one arm's look at the test split (and the fresh slices beside it) in one
    step, once its checkpoint is chosen and just before it is measured: another process of
    the same arm and seed that started beside this one is refused here (`SecondLook`)."""
    from training.promotion.evaluation.split_looks import split_look_take

    if options.looks_log is None:
        return
    split_look_take(
        family=look_family(arm, options),
        script="scripts/learn_from_comments.py",
        argv=options.argv,
        seeds=[seed],
        reason=options.second_look,
        path=options.looks_log,
        run=options.run,
        commit=options.commit,
    )


def run(options: Options) -> None:
    """Every seed of `options`: comments, arms, measurements; each record appended. Each arm's
    measurement on the test split is a look: checked before anything runs (`looks_check`),
    checked again and logged just before it is measured (`look_take`). The base's
    measurement is not a look: nothing is chosen from it."""
    from training.promotion.evaluation.split_looks import repository_commit

    options.run = options.run or time.strftime("%Y%m%d-%H%M%S")
    options.commit = options.commit or repository_commit()  # the code that runs, not the one at the end
    looks_check(options)
    base_model, tokenizer = load_base(options.model)
    base = Harness(base_model, tokenizer)
    judge = JudgeServer(options) if set(JUDGE_ARMS) & set(options.arms) else None
    with judge or contextlib.nullcontext():
        _run_seeds(options, base, judge)


def _run_seeds(options: Options, base, judge: JudgeServer | None) -> None:
    for seed in options.seeds:
        random.seed(seed)
        comments = comments_set(harness=base, seed=seed, options=options)
        training_set = comments["training_set"]
        log(f"seed {seed}: {comments['review']} on {comments['episodes']} episodes → {training_set}")
        comments_log(options, seed, comments)
        for key, result in base_measures(base, seed=seed, options=options).items():
            split, _, fresh = key.partition("-")
            append(
                options,
                {
                    "kind": "base",
                    "seed": seed,
                    "split": split,
                    "fresh_seed": int(fresh) if fresh else None,
                    "setup": base_setup(options),
                    "measure": result,
                },
            )
        for arm in options.arms:
            run_dir = options.out / "runs" / f"{options.run}-{arm}-seed{seed}"
            log(f"{arm} seed {seed}: training")
            policy, info = arm_train(arm, comments=comments, seed=seed, options=options, run_dir=run_dir, judge=judge)
            if policy is None:
                log(f"{arm} seed {seed} skipped: {info}")
                append(options, {"kind": "skipped", "recipe": arm, "seed": seed, "reason": info})
                continue
            # Kept, to draw its decision curve later: desk_experiment.py curve --adapter DIR.
            policy.model.save_pretrained(run_dir / "adapter")
            info["adapter"] = str(run_dir / "adapter")
            try:
                look_take(options, arm, seed)
            except SecondLook as exc:
                log(f"{arm} seed {seed} not measured: {exc}")
                append(options, {"kind": "skipped", "recipe": arm, "seed": seed, "reason": f"not measured: {exc}"})
                continue
            harness = Harness(policy.model, policy.tokenizer)
            found = measures(harness, seed=seed, options=options, label=arm)
            append(options, {"kind": "candidate", "recipe": arm, "seed": seed, "train": info, "measures": found})
            del policy, harness


def summary(path: Path, run_id: str = "", *, seeds_registered: int = 5) -> None:
    """The run's tables (the latest run in `path` unless `run_id` is given)."""
    text = path.read_text() if path.exists() else ""
    # A process of the run may be appending now: its record is whole only once its newline is.
    records = [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]
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
        if r["kind"] == "candidate" and "note" in r["train"]:
            note, items = r["train"]["note"], r["train"]["items"]
            print(
                f"\n  {r['recipe']} seed {r['seed']}: note: {note.get('rule_text') or note.get('none')}; "
                f"{items['judge']} judge items, {items['note']} note items"
            )
        if r["kind"] == "skipped":
            print(f"\n  {r['recipe']} seed {r['seed']} skipped: {r['reason']}")
    for line in processes_agreement(records):
        print(line)
    print()
    summary_print([r for r in records if r["kind"] in ("base", "candidate")])
    for line in endpoints(records, seeds_registered=seeds_registered):
        print(line)


def processes_agreement(records: list[dict[str, Any]]) -> list[str]:
    """One line per thing a run did more than once (a seed's arms run in processes of their
    own each play the lead's episodes and the base): whether each time gave the same. The
    lead's episodes and comments are what the arms train on; the base's test and fresh
    episodes are what they are paired with (the last measurement), so a disagreement is
    printed, not hidden."""
    done: dict[tuple[int, str], list[Any]] = {}
    for r in records:
        if r["kind"] == "comments":
            key = "the lead's episodes and comments"
            what = [r["episodes"], r["successes"], r["review"], r["items"]]
        elif r["kind"] == "base":
            key = "base " + slice_key(r["split"], r["fresh_seed"])
            what = r["measure"]["episodes"]
        else:
            continue
        done.setdefault((r["seed"], key), []).append(what)
    lines = []
    for (seed, key), times in sorted(done.items()):
        if len(times) > 1:
            same = all(t == times[0] for t in times[1:])
            verdict = "the same each time" if same else "DIFFERENT (the last is used)"
            lines.append(f"  seed {seed}, {key}: {len(times)} times, {verdict}")
    if lines:
        lines.insert(0, "\nDone more than once (each process of a seed does it):\n")
    return lines


def _test_episodes(records: list[dict[str, Any]]) -> tuple[dict[int, list[dict]], dict[tuple[str, int], list[dict]]]:
    """The base's and each arm's test-split episodes by seed (an arm's latest run of a seed)."""
    base = {r["seed"]: r["measure"]["episodes"] for r in records if r["kind"] == "base" and r["split"] == "test"}
    arms = {
        (r["recipe"], r["seed"]): r["measures"]["test"]["episodes"]
        for r in latest_runs(records)
        if r["kind"] == "candidate" and "test" in r["measures"]
    }
    return base, arms


def _paired(
    first: dict[int, list[dict]], second: dict[int, list[dict]], *, what: str, left_out: list[str]
) -> dict[int, tuple[list[dict], list[dict]]]:
    """Each seed both played, with their episodes, where they played the same tasks in the
    same order (with the same sampling seeds, as a run plays them); a seed where they did not
    is left out and said in `left_out`."""
    out = {}
    for seed in sorted(set(first) & set(second)):
        a, b = first[seed], second[seed]
        if [e["task"] for e in a] != [e["task"] for e in b]:
            left_out.append(f"seed {seed} left out of {what}: the two did not play the same tasks")
            continue
        out[seed] = (a, b)
    return out


def _gain(paired: dict[int, tuple[list[dict], list[dict]]]):
    """The second's gain over the first with its task-bootstrap interval (None: no pair)."""
    from training.promotion.evaluation.bootstrap import PairedEpisode, task_bootstrap_gain

    return task_bootstrap_gain(
        PairedEpisode(
            seed=seed, task=x["task"], kind=x.get("kind", ""), base=float(x["success"]), candidate=float(y["success"])
        )
        for seed, (a, b) in paired.items()
        for x, y in zip(a, b, strict=True)
    )


def endpoints(records: list[dict[str, Any]], *, seeds_registered: int = 5) -> list[str]:
    """The words-only comparison's registered endpoints on the test split, over the seeds
    measured so far: (1) A2 - A0 at least +0.10 with the task-bootstrap interval's low end
    above 0; (2) A2 - A3 above 0, paired by episode on the seeds both played; (3) A2's
    policy-violation rate (episodes with one) no higher than A0's on A2's seeds; and the
    share of A1's gain A2 recovers, (A2 - A0) / (A1 - A0), on the seeds all three played.
    Nothing is said to hold or fail before every arm has `seeds_registered` seeds (the
    comparison registered 5: docs/experiments/2026-12-07-words-only-comparison.md). A seed
    whose two measurements did not play the same tasks is left out, and said."""
    base, arms = _test_episodes(records)
    by_arm = {
        arm: {seed: eps for (name, seed), eps in arms.items() if name == arm}
        for arm in ("words", "words-shuffled", "oracle-sft")
    }
    words, shuffled, oracle = by_arm["words"], by_arm["words-shuffled"], by_arm["oracle-sft"]
    if not words:
        return []
    seeds_in = {arm: sorted(eps) for arm, eps in by_arm.items()}
    complete = all(len(s) >= seeds_registered for s in seeds_in.values())
    lines = [
        "\nThe words-only comparison's registered endpoints (test split; "
        + ", ".join(f"{arm} seeds {seeds or 'none'}" for arm, seeds in seeds_in.items())
        + ("" if complete else f"; {seeds_registered} seeds are registered: nothing is decided before they are in")
        + "):\n"
    ]
    left_out: list[str] = []

    def verdict(holds: bool) -> str:
        return ("holds" if holds else "fails") if complete else ("on course" if holds else "not met so far")

    with_base = _paired(base, words, what="A2 - A0", left_out=left_out)
    if gain := _gain(with_base):
        lines.append(
            f"  1. A2 - A0 = {gain.text()}: needs at least +0.10 with the low end above 0: "
            f"{verdict(gain.mean >= 0.10 and gain.ci_low > 0)}"
        )
    if versus := _gain(_paired(shuffled, words, what="A2 - A3", left_out=left_out)):
        lines.append(f"  2. A2 - A3 = {versus.text()}: needs above 0: {verdict(versus.mean > 0)}")
    if with_base:
        n = sum(len(a) for a, _ in with_base.values())
        v0 = sum(bool(e.get("violations")) for a, _ in with_base.values() for e in a)
        v2 = sum(bool(e.get("violations")) for _, b in with_base.values() for e in b)
        lines.append(
            f"  3. policy violations, A0 {v0}/{n} against A2 {v2}/{n}: needs A2's no higher: {verdict(v2 <= v0)}"
        )
    with_oracle = _paired(base, oracle, what="A1 - A0", left_out=left_out)
    common = sorted(set(with_oracle) & set(with_base))
    a1 = _gain({s: with_oracle[s] for s in common})
    a2 = _gain({s: with_base[s] for s in common})
    if a1 and a2:
        share = f"{a2.mean / a1.mean:.0%}" if a1.mean > 0 else "- (A1's gain is not above 0)"
        lines.append(f"  A1's gain that A2 recovers, seeds {common}: ({a2.mean:+.3f}) / ({a1.mean:+.3f}) = {share}")
    return lines + [f"  {line}" for line in left_out]
