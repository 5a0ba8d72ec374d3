"""Every signal about a candidate, side by side with the live version, for the promotion page
and the regression precondition.

Each `Signal` has the candidate's value, the live version's (or the job's starting model's),
the difference with its 95% interval, the direction in which a difference is better, and the
threshold beyond which a worse difference is a regression:

| signal | candidate vs | regression when Δ is worse than |
|---|---|---|
| job's held-out success (last vs first evaluation of the producing job) | the job's starting model | -0.05 |
| job's canary reward (last vs first) | the job's starting model | -0.05 |
| evaluation win rate (vs 0.5, a tie with itself) | live | -0.05 |
| evaluation mean judge-reward difference (paired) | live | -0.05 |
| evaluation grader accuracy | live | -0.05 |
| evaluation task success (whole episodes) | live | -0.05 |
| collateral changes, unknown-id tool calls (episodes) | live | any rise: the harm precondition, no override |
| monitor breaches, judge agreement | — | shown; breaches have their own precondition |

A regression blocks the request unless the requester gives a reason (audited, with who);
the approver sees the reason beside the figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from training.evaluation.metrics import Z_95, wilson_interval
from training.promotion.models import Evaluation
from training.serving.models import ModelVersion
from webapp.work import WorkStatus

THRESHOLDS: dict[str, float] = {
    "job_heldout": 0.05,
    "job_canary": 0.05,
    "win_rate": 0.05,
    "reward_diff": 0.05,
    "graded_accuracy": 0.05,
    "episode_success": 0.05,
    "collateral": 0.0,
    "unknown_ids": 0.0,
}


@dataclass(frozen=True)
class Signal:
    code: str
    label: str
    source: str  # where the figures come from, in words
    candidate: float | None
    live: float | None
    delta: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    higher_is_better: bool = True
    threshold: float | None = None
    n: str = ""
    gates: bool = True  # counted by the regression precondition
    note: str = ""
    curve: list[tuple[int, float]] = field(default_factory=list)

    @property
    def gain(self) -> float | None:
        """The difference signed so that positive is better."""
        if self.delta is None:
            return None
        return self.delta if self.higher_is_better else -self.delta

    @property
    def direction(self) -> str:
        """ "better", "worse" or "same" (no difference or none measured)."""
        gain = self.gain
        if gain is None or abs(gain) < 1e-9:
            return "same"
        return "better" if gain > 0 else "worse"

    @property
    def regressed(self) -> bool:
        gain = self.gain
        return self.threshold is not None and gain is not None and gain < -self.threshold - 1e-12

    def describe(self) -> str:
        base = "—" if self.live is None else f"{self.live:.3f}"
        cand = "—" if self.candidate is None else f"{self.candidate:.3f}"
        ci = "" if self.ci_low is None else f", 95% CI [{self.ci_low:+.3f}, {self.ci_high:+.3f}]"
        return f"{self.label}: {base} → {cand} (Δ {self.delta:+.3f}{ci}; threshold {self.threshold:.2f})"

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "label": self.label,
            "source": self.source,
            "candidate": self.candidate,
            "live": self.live,
            "delta": self.delta,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "higher_is_better": self.higher_is_better,
            "threshold": self.threshold,
            "n": self.n,
            "direction": self.direction,
            "regressed": self.regressed,
            "gates": self.gates,
            "note": self.note,
        }


def difference_interval(
    a: float, n_a: int, b: float, n_b: int, *, z: float = Z_95
) -> tuple[float | None, float | None]:
    """Newcombe's hybrid score interval for a difference of two proportions a - b (from each
    one's Wilson interval): L = d - √((a - l_a)² + (u_b - b)²), U = d + √((u_a - a)² + (b - l_b)²)."""
    if n_a <= 0 or n_b <= 0:
        return None, None
    la, ua = wilson_interval(a * n_a, n_a, z=z)
    lb, ub = wilson_interval(b * n_b, n_b, z=z)
    d = a - b
    return d - math.sqrt((a - la) ** 2 + (ub - b) ** 2), d + math.sqrt((ua - a) ** 2 + (b - lb) ** 2)


def _proportion_signal(code, label, source, cand, live, n_cand, n_live, **kw) -> Signal:
    delta = None if cand is None or live is None else cand - live
    low, high = (None, None) if delta is None else difference_interval(cand, n_cand, live, n_live)
    return Signal(
        code,
        label,
        source,
        cand,
        live,
        delta,
        low,
        high,
        threshold=THRESHOLDS.get(code),
        n=f"n {n_cand} / {n_live}",
        **kw,
    )


def job_signals(candidate: ModelVersion) -> list[Signal]:
    """The producing job's own held-out curve and canaries: its last evaluation against its
    first (the starting model, step 0)."""
    from training.models import JobEventKind, TrainingJobEvent

    job = getattr(candidate, "produced_by_job", None)
    if job is None:
        return []
    evals = list(
        TrainingJobEvent.objects.filter(job=job, kind=JobEventKind.EVAL).order_by("step", "id").values("step", "data")
    )
    signals = []
    start = job.base_version.name if job.base_version_id else "the starting model"
    rated = [(e["step"], e["data"]) for e in evals if e["data"].get("success") is not None]
    if len(rated) >= 2:
        (_, first), (last_step, last) = rated[0], rated[-1]
        signals.append(
            _proportion_signal(
                "job_heldout",
                "Job's held-out success",
                f"training job {job.pk}: step {last_step} vs step {rated[0][0]} ({start})",
                float(last["success"]),
                float(first["success"]),
                int(last.get("n") or 0),
                int(first.get("n") or 0),
                curve=[(int(s), float(d["success"])) for s, d in rated],
            )
        )
    canaries = [(e["step"], e["data"]["canary_reward"]) for e in evals if e["data"].get("canary_reward") is not None]
    if len(canaries) >= 2:
        first, last = canaries[0][1], canaries[-1][1]
        signals.append(
            Signal(
                "job_canary",
                "Job's canary reward",
                f"training job {job.pk}: step {canaries[-1][0]} vs step {canaries[0][0]} ({start})",
                float(last),
                float(first),
                float(last) - float(first),
                threshold=THRESHOLDS["job_canary"],
                curve=[(int(s), float(v)) for s, v in canaries],
            )
        )
    return signals


def _items_of(evaluation: Evaluation) -> str:
    """Which held-out items the evaluation's figures are on, in words: the approver reads a
    failure mode's evaluation slice there as the regression test it is."""
    training_set = evaluation.training_set if evaluation.training_set_id else None
    if training_set is None:
        return ""
    selection = training_set.selection or {}
    if selection.get("kind") == "failure_mode":
        return f" on {training_set}, the evaluation slice of failure mode “{selection.get('failure_mode', '')}”"
    return f" on {training_set}"


def evaluation_signals(evaluation: Evaluation | None) -> list[Signal]:
    if evaluation is None or evaluation.status != WorkStatus.FINISHED:
        return []
    summary = evaluation.summary or {}
    cand, live = summary.get("candidate") or {}, summary.get("baseline") or {}
    comparison = summary.get("comparison") or {}
    source = f"evaluation {evaluation.pk}{_items_of(evaluation)}"
    signals = []
    if comparison.get("win_rate") is not None:
        signals.append(
            Signal(
                "win_rate",
                "Evaluation win rate",
                f"{source}: (wins + ties/2) / compared; live against itself is 0.5",
                comparison["win_rate"],
                0.5,
                comparison["win_rate"] - 0.5,
                None if comparison.get("ci_low") is None else comparison["ci_low"] - 0.5,
                None if comparison.get("ci_high") is None else comparison["ci_high"] - 0.5,
                threshold=THRESHOLDS["win_rate"],
                n=f"n {comparison.get('n', 0)}",
            )
        )
    if comparison.get("reward_diff_mean") is not None:
        signals.append(
            Signal(
                "reward_diff",
                "Mean judge reward",
                f"{source}: paired difference per item",
                cand.get("reward_mean"),
                live.get("reward_mean"),
                comparison["reward_diff_mean"],
                comparison.get("reward_diff_ci_low"),
                comparison.get("reward_diff_ci_high"),
                threshold=THRESHOLDS["reward_diff"],
                n=f"n {comparison.get('reward_diff_n', 0)}",
            )
        )
    if cand.get("graded_accuracy") is not None and live.get("graded_accuracy") is not None:
        signals.append(
            _proportion_signal(
                "graded_accuracy",
                "Grader accuracy",
                f"{source}: replayable items",
                cand["graded_accuracy"],
                live["graded_accuracy"],
                cand.get("graded_n", 0),
                live.get("graded_n", 0),
            )
        )
    ce, le = cand.get("episodes"), live.get("episodes")
    if ce and le:
        env = (evaluation.sources or {}).get("environment") or {}
        where = f"{source}: whole episodes, {env.get('name', '')} {env.get('split', '')}".strip()
        if ce["success"]["n"] and le["success"]["n"]:
            signals.append(
                _proportion_signal(
                    "episode_success",
                    "Task success",
                    where,
                    ce["success"]["rate"],
                    le["success"]["rate"],
                    ce["success"]["n"],
                    le["success"]["n"],
                )
            )
        for key, label in (("collateral", "Collateral changes"), ("unknown_ids", "Tool calls on unknown ids")):
            signals.append(
                _proportion_signal(
                    key,
                    label,
                    where,
                    ce[key]["rate"],
                    le[key]["rate"],
                    ce[key]["n"],
                    le[key]["n"],
                    higher_is_better=False,
                    gates=False,
                    note="any rise blocks (harm precondition, no override)",
                )
            )
    return signals


def promotion_signals(*, candidate: ModelVersion, evaluation: Evaluation | None) -> list[Signal]:
    """Every signal with a difference to measure, the job's first, then the evaluation's."""
    return job_signals(candidate) + evaluation_signals(evaluation)


def regressions(signals: list[Signal]) -> list[Signal]:
    return [s for s in signals if s.gates and s.regressed]
