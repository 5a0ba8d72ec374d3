"""The desk experiment's tables count each seed once: a seed trained again replaces its
earlier run, and a later look at the kept adapter adds its slices to that run."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "scripts"))

from desk.summary import latest_runs, summary_print


def _episodes(successes: int, n: int = 4) -> dict:
    rows = [
        {
            "task": f"t{i}",
            "kind": "refundable_recent",
            "refund": True,
            "success": i < successes,
            "collateral": 0,
            "unknown_ids": 0,
            "first_call_other": 0,
            "violations": [],
        }
        for i in range(n)
    ]
    return {"episodes": rows}


def _run(seed: int, adapter: str, **measures) -> dict:
    return {
        "kind": "candidate",
        "recipe": "r",
        "seed": seed,
        "train": {"adapter": adapter, "step_kept": 3},
        "measures": measures,
    }


def test_a_seed_trained_again_replaces_its_earlier_run_and_a_later_look_joins_it(capsys):
    records = [
        {"kind": "base", "seed": 0, "split": "validation", "fresh_seed": None, "measure": _episodes(0)},
        {"kind": "base", "seed": 0, "split": "test", "fresh_seed": None, "measure": _episodes(1)},
        {"kind": "base", "seed": 1, "split": "validation", "fresh_seed": None, "measure": _episodes(0)},
        _run(0, "first", validation=_episodes(1)),
        _run(1, "other", validation=_episodes(2)),
        _run(0, "again", validation=_episodes(3)),  # the same seed trained again
        _run(0, "again", test=_episodes(4)),  # its one look at the test split
    ]
    runs = latest_runs(records)
    assert [(r["seed"], r["train"]["adapter"]) for r in runs] == [(1, "other"), (0, "again")]
    again = runs[1]["measures"]
    assert set(again) == {"validation", "test"}
    assert sum(e["success"] for e in again["validation"]["episodes"]) == 3  # not the first run's 1

    summary_print(records)
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| r | validation |")]
    assert len(rows) == 3  # seeds 1 and 0, then over seeds: seed 0 once
    assert "| r | validation | 2 |" in out  # two seeds over seeds, not three runs
    # By kind, on validation: seed 0's second run (3/4) and seed 1 (2/4), not the first run.
    assert "5/8 (0)" in out


def test_by_kind_each_recipe_stands_beside_the_base_of_its_own_seeds(capsys):
    """A comparison run seed by seed: one arm has seeds 0 and 1, another seed 0 only. Each
    stands beside the base summed over its own seeds, not over every seed the base played."""
    from desk.summary import kinds_table

    def base(seed: int, successes: int) -> dict:
        return {"kind": "base", "seed": seed, "split": "test", "fresh_seed": None, "measure": _episodes(successes)}

    def run(recipe: str, seed: int, successes: int) -> dict:
        return {**_run(seed, f"{recipe}{seed}", test=_episodes(successes)), "recipe": recipe}

    records = [base(0, 1), base(1, 2), run("words", 0, 3), run("words", 1, 4), run("oracle", 0, 4)]
    kinds_table(records, "test")
    out = capsys.readouterr().out
    assert "| kind of task | base, seeds 0, 1 | words | base, seed 0 | oracle |" in out
    row = next(line for line in out.splitlines() if line.startswith("| delivered at most"))
    assert row.split(" | ")[1:] == ["3/8 (0)", "7/8 (0)", "1/4 (0)", "4/4 (0) |"]
    kinds_table(records[:4], "test")  # one set of seeds: one base column, over those seeds
    out = capsys.readouterr().out
    assert "| kind of task | base | words |" in out and "| 3/8 (0) | 7/8 (0) |" in out
