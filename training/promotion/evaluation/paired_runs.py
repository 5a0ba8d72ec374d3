"""Base vs candidate over paired runs: per slice and over seeds, success, collateral-change
and policy-violation rates with their 95 % t intervals, the gain with its task-bootstrap
interval (tasks stratified by kind, and seeds: `training.promotion.evaluation.bootstrap`), successes
per kind, and the gain paired episode by episode.

A seed is one pair of runs on the same tasks with the same sampling seeds: the base's and
the candidate's figures, each {"version", "graded", "success_rate", "collateral_rate" (None:
not measured), "violation_rate" (None: not measured), "per_episode": [{"index", "task",
"success", "kind", "violations"}]}, the shape `scripts/tour_demo.py` writes and
`webapp.site.selectors_measurements` rebuilds from traces (files written before kinds and
violations were measured lack them: one stratum, no violation figure).
Pure: no database, no Django.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.promotion.evaluation.bootstrap import Gain, PairedEpisode, task_bootstrap_gain
from training.promotion.evaluation.seeds import mean_interval

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
    # The gain with its interval from a bootstrap over tasks (stratified by kind) and seeds:
    # what a repeat of the whole measurement, on other tasks of the same kinds, could give.
    task_gain: Gain | None = None
    base_violations: Interval | None = None  # None where some run did not measure them
    candidate_violations: Interval | None = None
    # Per kind of task, over every seed: {kind: {"label", "base": [successes, graded],
    # "candidate": [...], "base_violations": [episodes, n], "candidate_violations": [...]}},
    # in the order of `labels` given to `slice_summaries`, then as first seen.
    by_kind: dict[str, dict[str, Any]] | None = None

    @property
    def task_interval(self) -> Interval | None:
        """The task-bootstrap gain as (mean, low, high)."""
        g = self.task_gain
        return None if g is None else (g.mean, g.ci_low, g.ci_high)


def episode_pairs(base: dict, cand: dict) -> list[tuple[dict, dict]]:
    """One seed's (base episode, candidate episode) pairs: by episode index where both carry
    one (a stopped run may lack some), else by position; either way only where both played
    the same task."""
    before, after = base.get("per_episode") or [], cand.get("per_episode") or []
    if all("index" in e for e in (*before, *after)):
        by_index = {e["index"]: e for e in before}
        pairs = [(by_index[e["index"]], e) for e in after if e["index"] in by_index]
    else:
        pairs = list(zip(before, after, strict=False))
    return [(x, y) for x, y in pairs if x["task"] == y["task"]]


def paired_gains(base: list[dict], cand: list[dict]) -> list[float]:
    """Candidate minus base success per (seed, episode) pair (see `episode_pairs`)."""
    gains: list[float] = []
    for b, c in zip(base, cand, strict=True):
        gains += [float(y["success"]) - float(x["success"]) for x, y in episode_pairs(b, c)]
    return gains


def task_gain(base: list[dict], cand: list[dict]) -> Gain | None:
    """The gain over every (seed, episode) pair with its interval from the bootstrap over
    tasks, stratified by the kind each episode names, and seeds."""
    episodes = [
        PairedEpisode(
            seed=seed,
            task=str(x["task"]),
            kind=str(x.get("kind") or y.get("kind") or ""),
            base=float(x["success"]),
            candidate=float(y["success"]),
        )
        for seed, (b, c) in enumerate(zip(base, cand, strict=True))
        for x, y in episode_pairs(b, c)
    ]
    return task_bootstrap_gain(episodes)


def kinds_table(base: list[dict], cand: list[dict], labels: dict[str, str]) -> dict[str, dict[str, Any]] | None:
    """Successes and policy violations per kind of task over every seed's paired episodes
    (see `SliceSummary.by_kind`); None where no episode names its kind."""
    table: dict[str, dict[str, Any]] = {kind: {} for kind in labels}
    seen = False
    for b, c in zip(base, cand, strict=True):
        for x, y in episode_pairs(b, c):
            kind = str(x.get("kind") or y.get("kind") or "")
            if not kind:
                continue
            seen = True
            row = table.setdefault(kind, {})
            if not row:
                row.update(
                    label=labels.get(kind, kind),
                    base=[0, 0],
                    candidate=[0, 0],
                    base_violations=[0, 0],
                    candidate_violations=[0, 0],
                )
            for side, episode in (("base", x), ("candidate", y)):
                row[side][0] += int(bool(episode["success"]))
                row[side][1] += 1
                if episode.get("violations") is not None:
                    row[f"{side}_violations"][0] += int(bool(episode["violations"]))
                    row[f"{side}_violations"][1] += 1
    return {k: v for k, v in table.items() if v} if seen else None


def slice_summaries(
    per_seed: list[dict[str, Any]], slices: list[str], *, labels: dict[str, str] | None = None
) -> list[SliceSummary]:
    """Per slice: the base's and the candidate's success, collateral-change and
    policy-violation rates over the seeds that measured both, with 95 % t intervals; the
    gain with its task-bootstrap interval; successes per kind (`labels`: each kind's label,
    in the order to show them); and the gain paired by episode."""
    out = []
    for key in slices:
        rows = [r for r in per_seed if key in r["base"] and key in r["candidate"]]
        if not rows:
            continue
        base = [r["base"][key] for r in rows]
        cand = [r["candidate"][key] for r in rows]
        has_collateral = all(f.get("collateral_rate") is not None for f in (*base, *cand))
        has_violations = all(f.get("violation_rate") is not None for f in (*base, *cand))
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
                task_gain=task_gain(base, cand),
                base_violations=_rate([b["violation_rate"] for b in base]) if has_violations else None,
                candidate_violations=_rate([c["violation_rate"] for c in cand]) if has_violations else None,
                by_kind=kinds_table(base, cand, labels or {}),
            )
        )
    return out


def _rate(values: list[float]) -> Interval:
    """A rate's mean and t interval, kept inside [0, 1] where a rate lives."""
    mean, low, high = mean_interval(values)
    return mean, max(0.0, low), min(1.0, high)
