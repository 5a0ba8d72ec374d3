"""What a tour run measured and how it is summarised: each run's graded figures (the shape
`scripts/tour_demo.py` writes to its result.json, per seed and slice) and the summary over
seeds, printed after every seed, at the end, and by `--summary-from` from result.json files
alone.
"""

from __future__ import annotations

import json
from pathlib import Path


def outcome(run) -> dict:
    """A run's graded figures: success, collateral-change and policy-violation rates with
    their counts, and each graded episode's task, kind, success and violations."""
    graded = [ep for ep in run.episodes if ep.reward is not None]
    done = [ep for ep in run.episodes if ep.end != "error"]
    return {
        "episodes": len(run.episodes),
        "graded": len(graded),
        "successes": sum(1 for ep in graded if ep.success),
        "success_rate": run.success_rate,
        "collateral": sum(1 for ep in done if ep.collateral_changes),
        "collateral_rate": run.collateral_rate,
        "violations": sum(1 for ep in done if ep.policy_violations),
        "violation_rate": run.violation_rate,
        "unknown_id_episodes": sum(1 for ep in done if ep.unknown_ids),
        # Per graded episode, in task order: a base and a candidate of one seed play the same
        # tasks with the same sampling seeds, so these pair up episode by episode.
        "per_episode": [
            {
                "index": ep.trace_id.rsplit("-", 1)[-1],
                "task": ep.task_id,
                "kind": ep.kind,
                "success": bool(ep.success),
                "violations": ep.policy_violations,
            }
            for ep in graded
        ],
    }


def _count(cell: list[int]) -> str:
    return f"{cell[0]}/{cell[1]}" if cell[1] else "-"


def summary_lines(per_seed: list[dict], slices: list[str]) -> list[str]:
    """Per slice, base and candidate over the seeds: success, collateral changes and policy
    violations (mean with its t interval over seeds), the gain with its task-bootstrap
    interval (tasks stratified by kind, and seeds), and successes and violations per kind."""
    from training.environments.support_desk import KINDS
    from training.promotion.evaluation.paired_runs import slice_summaries
    from training.promotion.evaluation.seeds import interval_format as _text

    lines = []
    for s in slice_summaries(per_seed, slices, labels=KINDS):
        lines.append(
            f"{s.slice} ({s.seeds} seeds, {s.episodes} graded episodes each; mean [95 % interval]):\n"
            f"  success             base {_text(s.base_success, s.seeds)}  "
            f"candidate {_text(s.candidate_success, s.seeds)}  gain {_text(s.gain, s.seeds)} (t over seeds)"
            + (
                f"\n  collateral changes  base {_text(s.base_collateral, s.seeds)}  "
                f"candidate {_text(s.candidate_collateral, s.seeds)}"
                if s.base_collateral is not None and s.candidate_collateral is not None
                else ""
            )
            + (
                f"\n  policy violations   base {_text(s.base_violations, s.seeds)}  "
                f"candidate {_text(s.candidate_violations, s.seeds)}"
                if s.base_violations is not None and s.candidate_violations is not None
                else ""
            )
        )
        if s.task_gain is not None:
            lines.append(f"  gain {s.task_gain.text()}")
        if s.by_kind:
            lines.append("  by kind, every seed (successes base → candidate; policy violations base → candidate):")
            width = max(len(row["label"]) for row in s.by_kind.values())
            for row in s.by_kind.values():
                lines.append(
                    f"    {row['label']:<{width}}  {_count(row['base']):>7} → {_count(row['candidate']):<7}  "
                    f"violations {_count(row['base_violations'])} → {_count(row['candidate_violations'])}"
                )
        if s.paired is not None:
            lines.append(
                f"  gain paired by episode over {s.pairs} (seed, task) pairs  {_text(s.paired, s.pairs)}"
                " (pairs counted as independent: too narrow)"
            )
    return lines


def per_seed_from_results(paths: list[Path]) -> tuple[list[dict], list[str]]:
    """The seeds of several result.json files (runs of one recipe, e.g. a seed rerun after a
    stop) as one list; a seed measured in two files is an error, not a silent overwrite."""
    per_seed: list[dict] = []
    slices: list[str] = []
    for path in paths:
        result = json.loads(path.read_text())
        for row in result["seeds"]:
            if any(r["seed"] == row["seed"] for r in per_seed):
                raise SystemExit(f"{path}: seed {row['seed']} is already in an earlier file")
            per_seed.append(row)
            slices += [k for k in row["base"] if k not in slices]
    return sorted(per_seed, key=lambda r: r["seed"]), slices
