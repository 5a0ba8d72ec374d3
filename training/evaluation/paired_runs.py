"""Base vs candidate over paired runs: per slice and over seeds, success and collateral-change
rates with their 95 % t intervals, and the gain paired episode by episode.

A seed is one pair of runs on the same tasks with the same sampling seeds: the base's and
the candidate's figures, each {"version", "graded", "success_rate", "collateral_rate" (None:
not measured), "per_episode": [{"index", "task", "success"}]}, the shape
`scripts/tour_demo.py` writes and `webapp.selectors_measurements` rebuilds from traces.
Pure: no database, no Django.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.evaluation.seeds import mean_interval

Interval = tuple[float, float, float]  # mean, low, high


@dataclass(frozen=True)
class SliceSummary:
    """One slice's base and candidate figures over its seeds (a seed: one paired run)."""

    slice: str
    seeds: int
    episodes: int  # graded episodes of the first seed's base run
    candidates: tuple[str, ...]
    base_success: Interval
    candidate_success: Interval
    gain: Interval
    base_collateral: Interval | None  # None where some run has no replayable episode
    candidate_collateral: Interval | None
    # Candidate minus base success per (seed, episode) pair, every pair counted as independent:
    # how sure the gain is for these trained candidates on these tasks. Pairs of one seed
    # share one training run, so the recipe's own uncertainty is `gain`, over the seeds.
    paired: Interval | None
    pairs: int


def paired_gains(base: list[dict], cand: list[dict]) -> list[float]:
    """Candidate minus base success per (seed, episode) pair, where both list their episodes:
    by episode index where they carry one (a stopped run may lack some), else by position;
    either way only where both played the same task."""
    gains: list[float] = []
    for b, c in zip(base, cand, strict=True):
        before, after = b.get("per_episode") or [], c.get("per_episode") or []
        if all("index" in e for e in (*before, *after)):
            by_index = {e["index"]: e for e in before}
            pairs = [(by_index[e["index"]], e) for e in after if e["index"] in by_index]
        else:
            pairs = list(zip(before, after, strict=False))
        gains += [float(y["success"]) - float(x["success"]) for x, y in pairs if x["task"] == y["task"]]
    return gains


def slice_summaries(per_seed: list[dict[str, Any]], slices: list[str]) -> list[SliceSummary]:
    """Per slice: the base's and the candidate's success and collateral-change rates over
    the seeds that measured both, with 95 % t intervals, and the gain paired by episode."""
    out = []
    for key in slices:
        rows = [r for r in per_seed if key in r["base"] and key in r["candidate"]]
        if not rows:
            continue
        base = [r["base"][key] for r in rows]
        cand = [r["candidate"][key] for r in rows]
        has_collateral = all(f.get("collateral_rate") is not None for f in (*base, *cand))
        gains = paired_gains(base, cand)
        out.append(
            SliceSummary(
                slice=key,
                seeds=len(rows),
                episodes=base[0]["graded"],
                candidates=tuple(dict.fromkeys(c["version"] for c in cand if c.get("version"))),
                base_success=_rate([b["success_rate"] for b in base]),
                candidate_success=_rate([c["success_rate"] for c in cand]),
                gain=mean_interval([c["success_rate"] - b["success_rate"] for b, c in zip(base, cand, strict=True)]),
                base_collateral=_rate([b["collateral_rate"] for b in base]) if has_collateral else None,
                candidate_collateral=_rate([c["collateral_rate"] for c in cand]) if has_collateral else None,
                paired=mean_interval(gains) if len(gains) > 1 else None,
                pairs=len(gains),
            )
        )
    return out


def _rate(values: list[float]) -> Interval:
    """A rate's mean and t interval, kept inside [0, 1] where a rate lives."""
    mean, low, high = mean_interval(values)
    return mean, max(0.0, low), min(1.0, high)
