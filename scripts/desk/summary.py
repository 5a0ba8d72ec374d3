"""The runs' tables: per seed, over seeds with their intervals, and by kind of task."""

from __future__ import annotations

from typing import Any


def rates(measure: dict[str, Any], n: int) -> dict[str, Any]:
    """The figures of a measurement's first `n` episodes (a base and a candidate of one seed
    play the same tasks in the same order with the same seeds, so prefixes pair up)."""
    rows = measure["episodes"][:n]
    refundable = [r for r in rows if r["refund"]]
    others = [r for r in rows if not r["refund"]]
    return {
        "n": len(rows),
        "success": sum(r["success"] for r in rows) / len(rows),
        "collateral": sum(r["collateral"] for r in rows) / len(rows),
        "violations": sum(bool(r.get("violations")) for r in rows) / len(rows),
        "unknown_ids": sum(r["unknown_ids"] for r in rows) / len(rows),
        "first_call_other": sum(r["first_call_other"] for r in rows) / len(rows),
        "refunded": f"{sum(r['success'] for r in refundable)}/{len(refundable)}",
        "left_alone": f"{sum(r['success'] for r in others)}/{len(others)}",
    }


def latest_runs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One candidate record per (recipe, seed): a seed trained again replaces its earlier
    run, and a later look at a kept adapter (`measure`) adds its slices to that adapter's
    run (or replaces a slice it measured before), so no seed counts twice in a table."""
    latest: dict[tuple[str, int], dict[str, Any]] = {}
    last: dict[tuple[str, int], int] = {}
    for i, r in enumerate(records):
        if r["kind"] != "candidate":
            continue
        kept = latest.get((r["recipe"], r["seed"]))
        same = kept is not None and kept["train"].get("adapter") == r["train"].get("adapter")
        latest[(r["recipe"], r["seed"])] = {**r, "measures": {**(kept["measures"] if same else {}), **r["measures"]}}
        last[(r["recipe"], r["seed"])] = i
    # In the order of each seed's latest record, as the log reads (the bootstrap's draws
    # follow the order of its pairs, so the printed intervals stay those of earlier pages).
    return [latest[key] for key in sorted(latest, key=last.__getitem__)]


def summary_print(records: list[dict[str, Any]]) -> None:
    """The per-seed and over-seeds tables of `records` (base and candidate runs)."""
    from training.promotion.evaluation.seeds import interval_text

    base = {}
    for r in records:
        if r["kind"] == "base":
            key = r["split"] if r["fresh_seed"] is None else f"fresh-{r['fresh_seed']}"
            base[(key, r["seed"])] = r["measure"]
    # Recipes in the order the log first names them.
    by_recipe: dict[str, list[dict]] = {r["recipe"]: [] for r in records if r["kind"] == "candidate"}
    for r in latest_runs(records):
        by_recipe[r["recipe"]].append(r)
    print("Per seed (oracle-graded episodes; base and candidate on the same tasks and sampling seeds):\n")
    print(
        "| recipe | slice | seed | episodes | steps kept | success base → candidate | collateral changes "
        "base → candidate | unknown-id calls base → candidate | first call names another order | "
        "refundable refunded | others left alone |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    from training.promotion.evaluation.bootstrap import PairedEpisode, task_bootstrap_gain

    pooled: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    # Candidate minus base success of each (seed, task) pair: one episode each, same seeds.
    paired: dict[tuple[str, str], list[float]] = {}
    episodes: dict[tuple[str, str], list[PairedEpisode]] = {}
    for recipe, runs in by_recipe.items():
        for r in runs:
            for key, measure in r["measures"].items():
                b = base.get((key, r["seed"]))
                if b is None:
                    continue
                n = min(len(measure["episodes"]), len(b["episodes"]))
                rb, rc = rates(b, n), rates(measure, n)
                pooled.setdefault((recipe, key), []).append((rb, rc))
                paired.setdefault((recipe, key), []).extend(
                    float(c["success"]) - float(b_["success"])
                    for b_, c in zip(b["episodes"][:n], measure["episodes"][:n], strict=True)
                )
                episodes.setdefault((recipe, key), []).extend(
                    PairedEpisode(
                        seed=r["seed"],
                        task=c["task"],
                        kind=c.get("kind", ""),
                        base=float(b_["success"]),
                        candidate=float(c["success"]),
                    )
                    for b_, c in zip(b["episodes"][:n], measure["episodes"][:n], strict=True)
                )
                print(
                    f"| {recipe} | {key} | {r['seed']} | {n} | {r['train']['step_kept']} | "
                    f"{rb['success']:.3f} → {rc['success']:.3f} | {rb['collateral']:.3f} → {rc['collateral']:.3f} | "
                    f"{rb['unknown_ids']:.3f} → {rc['unknown_ids']:.3f} | "
                    f"{rb['first_call_other']:.3f} → {rc['first_call_other']:.3f} | "
                    f"{rb['refunded']} → {rc['refunded']} | {rb['left_alone']} → {rc['left_alone']} |"
                )
    print(
        "\nOver seeds: mean [95 % t interval]; the gain also with its task-bootstrap interval (tasks "
        "stratified by kind, and seeds: the recipe's figure) and paired by episode (every (seed, task) "
        "counted as independent: too narrow):\n"
    )
    print(
        "| recipe | slice | seeds | base success | candidate success | gain | gain, task bootstrap | "
        "gain paired by episode | base collateral | candidate collateral | base policy violations | "
        "candidate policy violations | candidate unknown-id calls |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (recipe, key), pairs in pooled.items():
        gain = task_bootstrap_gain(episodes[recipe, key])
        print(
            f"| {recipe} | {key} | {len(pairs)} | {interval_text([b['success'] for b, _ in pairs])} | "
            f"{interval_text([c['success'] for _, c in pairs])} | "
            f"{interval_text([c['success'] - b['success'] for b, c in pairs])} | "
            f"{gain.text() if gain else '-'} | "
            f"{interval_text(paired[recipe, key])} (n = {len(paired[recipe, key])}) | "
            f"{interval_text([b['collateral'] for b, _ in pairs])} | "
            f"{interval_text([c['collateral'] for _, c in pairs])} | "
            f"{interval_text([b['violations'] for b, _ in pairs])} | "
            f"{interval_text([c['violations'] for _, c in pairs])} | "
            f"{interval_text([c['unknown_ids'] for _, c in pairs])} |"
        )
    for key in dict.fromkeys(key for _recipe, key in pooled):
        kinds_table(records, key)


def kinds_table(records: list[dict[str, Any]], slice_key: str = "test") -> None:
    """Successes and policy violations per kind of task on `slice_key`, summed over seeds,
    the base beside each recipe over the same seeds: where recipes have run on different
    seeds (a comparison still running seed by seed), each set of seeds gets its own base
    column, named with them. Records written before episodes named their kind are left out:
    their store was another."""
    from training.environments.support_desk import KINDS

    # The base's latest measurement of each (slice, seed), then each seed's latest run.
    bases = {
        (r["split"] if r["fresh_seed"] is None else f"fresh-{r['fresh_seed']}", r["seed"]): r["measure"]
        for r in records
        if r["kind"] == "base"
    }
    runs = latest_runs(records)
    first = {r["recipe"]: i for i, r in reversed(list(enumerate(records))) if r["kind"] == "candidate"}
    measured: dict[str, dict[int, dict[str, Any]]] = {}
    for r in sorted(runs, key=lambda r: first[r["recipe"]]):
        if slice_key in r["measures"]:
            measured.setdefault(r["recipe"], {})[r["seed"]] = r["measures"][slice_key]
    seed_sets = list(dict.fromkeys(tuple(sorted(by_seed)) for by_seed in measured.values()))
    columns: dict[str, dict[str, list[int]]] = {}

    def add(name: str, measures: list[dict[str, Any]]) -> None:
        column = columns.setdefault(name, {})
        for m in measures:
            for e in m["episodes"]:
                if not e.get("kind"):
                    continue
                cell = column.setdefault(e["kind"], [0, 0, 0])
                cell[0] += int(e["success"])
                cell[1] += 1
                cell[2] += int(bool(e.get("violations")))

    for seeds in seed_sets:
        named = (
            "base" if len(seed_sets) == 1 else f"base, seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
        )
        add(named, [bases[(slice_key, seed)] for seed in seeds if (slice_key, seed) in bases])
        for recipe, by_seed in measured.items():
            if tuple(sorted(by_seed)) == seeds:
                add(recipe, list(by_seed.values()))
    columns = {name: column for name, column in columns.items() if column}
    if not columns:
        return
    kinds = [k for k in KINDS if any(k in c for c in columns.values())]
    print(f"\nSuccesses (and policy violations) by kind of task ({slice_key}, every seed):\n")
    print("| kind of task | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for kind in kinds:
        cells = [f"{c[kind][0]}/{c[kind][1]} ({c[kind][2]})" if kind in c else "-" for c in columns.values()]
        print(f"| {KINDS[kind]} | " + " | ".join(cells) + " |")
