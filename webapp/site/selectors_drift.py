"""Drift watch: does the live version do worse on its new traffic than when it went live?

For each deployment's live version, two signals over the traffic it served since it went
live: task success (the traces' `outcome` grades) and customer ratings (customer feedback
with a rating; a thumbs-down or a score of 1-2 is unhappy). Each compares the version's first `DRIFT_WINDOW` outcomes with its latest
`DRIFT_WINDOW`; a drop of more than `DRIFT_DROP` flags the deployment on the overview. Four
queries per deployment, each cut by a LIMIT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db.models import Q

from feedback.models import CustomerFeedback, Grade, GradeOutcome
from training.serving.models import Deployment, LiveVersion
from webapp.site.selectors_measurements import OUTCOME_GRADE


@dataclass(frozen=True, slots=True)
class DriftSignal:
    code: str
    label: str
    baseline_rate: float | None
    recent_rate: float | None
    n: int  # outcomes of the live version so far (up to 2 windows are read)
    window: int
    drop: float | None
    threshold: float
    flagged: bool

    @property
    def detail(self) -> str:
        if self.drop is None:
            return f"{self.n} of the {2 * self.window} outcomes needed to compare"
        return (
            f"first {self.window}: {self.baseline_rate:.0%}, latest {self.window}: {self.recent_rate:.0%} "
            f"(drop {self.drop:+.0%}; flagged above {self.threshold:.0%})"
        )


def rate_drop(baseline: Sequence[int], recent: Sequence[int]) -> float | None:
    """drop = mean(baseline) - mean(recent), over 0/1 outcomes (1 good): positive when the
    recent traffic does worse. None when either window is empty."""
    if not baseline or not recent:
        return None
    return sum(baseline) / len(baseline) - sum(recent) / len(recent)


def _windows(rows, fields: tuple[str, ...], good, window: int) -> tuple[list[int], list[int], int]:
    """The first and latest `window` outcomes of `rows` (oldest first), and how many there are
    (up to 2 * window: beyond that the count is not needed)."""
    first = [good(r) for r in rows.order_by("created_at", "id").values_list(*fields)[: 2 * window]]
    if len(first) < 2 * window:
        return first, [], len(first)
    latest = [good(r) for r in rows.order_by("-created_at", "-id").values_list(*fields)[:window]]
    return first[:window], latest, 2 * window


def _signal(code: str, label: str, rows, fields: tuple[str, ...], good, window: int, threshold: float) -> DriftSignal:
    baseline, recent, n = _windows(rows, fields, good, window)
    drop = rate_drop(baseline, recent)
    return DriftSignal(
        code=code,
        label=label,
        baseline_rate=sum(baseline) / len(baseline) if drop is not None else None,
        recent_rate=sum(recent) / len(recent) if drop is not None else None,
        n=n,
        window=window,
        drop=drop,
        threshold=threshold,
        flagged=drop is not None and drop > threshold,
    )


def _success(row: tuple[str]) -> int:
    return int(row[0] == GradeOutcome.SUCCESS)


def _not_unhappy(row: tuple[str, int | None]) -> int:
    kind, rating = row
    return int(not ((kind == "thumbs" and rating == -1) or (kind == "score" and rating is not None and rating <= 2)))


def live_drift(
    *, deployment: Deployment, window: int | None = None, threshold: float | None = None
) -> list[DriftSignal]:
    """The live version's drift signals (none without a live version)."""
    window = window or settings.DRIFT_WINDOW
    threshold = settings.DRIFT_DROP if threshold is None else threshold
    live = LiveVersion.objects.filter(deployment=deployment).first()
    if live is None:
        return []
    served = {"deployment": deployment, "trace__model_version_id": live.version_id, "created_at__gte": live.changed_at}
    graded = Grade.objects.filter(name=OUTCOME_GRADE, **served)
    rated = CustomerFeedback.objects.filter(**served).exclude(Q(rating_kind="") | Q(rating__isnull=True))
    return [
        _signal("success", "Task success", graded, ("outcome",), _success, window, threshold),
        _signal(
            "rating", "Customer ratings not unhappy", rated, ("rating_kind", "rating"), _not_unhappy, window, threshold
        ),
    ]
