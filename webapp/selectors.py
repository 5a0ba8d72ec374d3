"""Reads for the overview page: per deployment, what happened over a recent window.

Everything is bounded: counts are over the last `days` days (each query filtered by time
on an indexed column, or cut by a LIMIT), and the graded outcomes are the latest
`max_graded`. Nothing counts a whole table.

Graded outcomes are customer feedback with `customer_ref: "grader"` — how a harness
reports a task's programmatic grade (the demo agent does; see feedback/demo/agent.py):
a score of 5 is a success, and the reward is (score - 1) / 4. They are attributed to the
model version that served the trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from django.db.models import Avg, Count, Q
from django.db.models.functions import TruncDate
from django.utils import timezone

from feedback.models import Comment, CustomerFeedback, Deployment, Trace, TraceFlag
from feedback.models.judge import JudgeResult, JudgeStatus
from training.models import LiveVersion, LiveVersionChange

GRADER_REF = "grader"
MAX_DEPLOYMENTS = 20
ROLLING = 10  # graded episodes per point of the success-rate curve
# Trace metadata `split` values of tasks no training set may contain (support-desk: test, fresh).
HELD_OUT_SPLITS = ("test", "fresh", "heldout")


@dataclass
class VersionStats:
    name: str
    graded: int = 0
    successes: int = 0
    reward_sum: float = 0.0
    judged: int = 0
    judge_reward: float | None = None
    first_at: datetime | None = None
    last_at: datetime | None = None
    live: bool = False
    heldout: int = 0  # graded episodes on held-out tasks (trace metadata `split`: test or heldout)
    heldout_successes: int = 0

    @property
    def success_rate(self) -> float | None:
        return self.successes / self.graded if self.graded else None

    @property
    def heldout_success_rate(self) -> float | None:
        return self.heldout_successes / self.heldout if self.heldout else None

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.graded if self.graded else None


@dataclass
class CurvePoint:
    index: int  # the graded episode's position in time order, from 1
    version: str
    rate: float  # success over this version's last ROLLING graded episodes (fewer at its start)


@dataclass
class DeploymentOverview:
    deployment: Deployment
    days: list[date]
    traces_per_day: list[int]
    live_version: str | None
    live_since: datetime | None
    comments: int
    customer_positive: int
    customer_negative: int
    customer_other: int
    graded_success: int
    graded_failure: int
    judged: int
    failure_modes: list[tuple[str, int]]
    versions: list[VersionStats]
    curve: list[CurvePoint] = field(default_factory=list)
    flips: list[tuple[datetime, str]] = field(default_factory=list)

    @property
    def traces_total(self) -> int:
        return sum(self.traces_per_day)

    @property
    def traces_peak(self) -> int:
        return max(self.traces_per_day, default=0)


def _graded(deployment: Deployment, since: datetime, limit: int) -> list[tuple[datetime, str, int, bool]]:
    """(when, version name, score, held out) of the latest `limit` graded outcomes, oldest first."""
    rows = (
        CustomerFeedback.objects.filter(
            deployment=deployment, customer_ref=GRADER_REF, rating_kind="score", created_at__gte=since
        )
        .order_by("-id")
        .values_list("created_at", "trace__model_version__name", "rating", "trace__metadata__split")[:limit]
    )
    return [
        (at, name or "(unknown version)", rating, split in HELD_OUT_SPLITS)
        for at, name, rating, split in reversed(list(rows))
    ]


def deployment_overview(
    *, deployment: Deployment, days: int = 14, now: datetime | None = None, max_graded: int = 500
) -> DeploymentOverview:
    now = now or timezone.now()
    today = timezone.localdate(now)
    first = today - timedelta(days=days - 1)
    since = now - timedelta(days=days)
    day_list = [first + timedelta(days=i) for i in range(days)]
    index = {d: i for i, d in enumerate(day_list)}

    per_day = [0] * days
    rows = (
        Trace.objects.filter(deployment=deployment, started_at__gte=since)
        .annotate(day=TruncDate("started_at"))
        .values("day")
        .annotate(n=Count("id"))
    )
    for r in rows:
        if r["day"] in index:
            per_day[index[r["day"]]] += r["n"]

    comments = Comment.objects.filter(trace__deployment=deployment, created_at__gte=since).count()
    fb = CustomerFeedback.objects.filter(deployment=deployment, created_at__gte=since).aggregate(
        success=Count("id", filter=Q(customer_ref=GRADER_REF, rating=5, rating_kind="score")),
        failure=Count("id", filter=Q(customer_ref=GRADER_REF, rating_kind="score") & ~Q(rating=5)),
        positive=Count(
            "id",
            filter=~Q(customer_ref=GRADER_REF)
            & (Q(rating_kind="thumbs", rating=1) | Q(rating_kind="score", rating__gte=4)),
        ),
        negative=Count(
            "id",
            filter=~Q(customer_ref=GRADER_REF)
            & (Q(rating_kind="thumbs", rating=-1) | Q(rating_kind="score", rating__lte=2)),
        ),
        total=Count("id", filter=~Q(customer_ref=GRADER_REF)),
    )
    flags = (
        TraceFlag.objects.filter(trace__deployment=deployment, trace_started_at__gte=since)
        .values("name")
        .annotate(n=Count("id"))
        .order_by("-n", "name")[:8]
    )
    judged = list(
        JudgeResult.objects.filter(
            trace__deployment=deployment, created_at__gte=since, status=JudgeStatus.SUCCEEDED, is_latest=True
        )
        .values("trace__model_version__name")
        .annotate(n=Count("id"), reward=Avg("reward"))
    )
    live = LiveVersion.objects.filter(deployment=deployment).select_related("version").first()
    flips = [
        (at, name)
        for at, name in LiveVersionChange.objects.filter(deployment=deployment, changed_at__gte=since)
        .order_by("changed_at")
        .values_list("changed_at", "to_version__name")[:50]
    ]

    versions: dict[str, VersionStats] = {}
    curve: list[CurvePoint] = []
    recent: dict[str, list[int]] = {}
    for i, (at, name, rating, heldout) in enumerate(_graded(deployment, since, max_graded), 1):
        v = versions.setdefault(name, VersionStats(name=name, first_at=at))
        v.graded += 1
        v.successes += int(rating == 5)
        v.heldout += int(heldout)
        v.heldout_successes += int(heldout and rating == 5)
        v.reward_sum += (rating - 1) / 4
        v.last_at = at
        window = recent.setdefault(name, [])
        window.append(int(rating == 5))
        del window[:-ROLLING]
        curve.append(CurvePoint(index=i, version=name, rate=sum(window) / len(window)))
    for row in judged:
        name = row["trace__model_version__name"] or "(unknown version)"
        v = versions.setdefault(name, VersionStats(name=name))
        v.judged, v.judge_reward = row["n"], row["reward"]
    live_name = live.version.name if live else None
    if live_name:
        versions.setdefault(live_name, VersionStats(name=live_name))
        versions[live_name].live = True
    ordered = sorted(versions.values(), key=lambda v: (v.first_at is None, v.first_at or now, v.name))
    return DeploymentOverview(
        deployment=deployment,
        days=day_list,
        traces_per_day=per_day,
        live_version=live_name,
        live_since=live.changed_at if live else None,
        comments=comments,
        customer_positive=fb["positive"],
        customer_negative=fb["negative"],
        customer_other=fb["total"] - fb["positive"] - fb["negative"],
        graded_success=fb["success"],
        graded_failure=fb["failure"],
        judged=sum(r["n"] for r in judged),
        failure_modes=[(r["name"], r["n"]) for r in flags],
        versions=ordered,
        curve=curve,
        flips=flips,
    )


def deployments_overview(*, days: int = 14, now: datetime | None = None) -> list[DeploymentOverview]:
    """The overview of each deployment (the first MAX_DEPLOYMENTS by name)."""
    return [
        deployment_overview(deployment=d, days=days, now=now)
        for d in Deployment.objects.order_by("name")[:MAX_DEPLOYMENTS]
    ]
