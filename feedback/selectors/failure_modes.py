"""Reads for the failure-modes page: runs, their clusters, and flag counts per day."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django.db.models import Count
from django.db.models.functions import TruncDate
from django.utils import timezone

from feedback.models import FailureCluster, FailureModeRun, TraceFlag
from training.serving.models import Deployment
from webapp.work import WorkStatus


@dataclass(slots=True)
class FlagSeries:
    name: str
    source: str
    counts: list[int]  # one per day, oldest first

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def peak(self) -> int:
        return max(self.counts, default=0)


def flag_counts_by_day(
    *, days: int = 14, deployment: Deployment | None = None, now: datetime | None = None
) -> tuple[list[date], list[FlagSeries]]:
    """Flagged traces per flag and per day the trace started, over the last `days` days
    (today included), most frequent flag first."""
    today = (now or timezone.now()).date()
    first = today - timedelta(days=days - 1)
    day_list = [first + timedelta(days=i) for i in range(days)]
    index = {d: i for i, d in enumerate(day_list)}
    qs = TraceFlag.objects.filter(trace__started_at__date__gte=first)
    if deployment is not None:
        qs = qs.filter(trace__deployment=deployment)
    rows = qs.annotate(day=TruncDate("trace__started_at")).values("name", "source", "day").annotate(n=Count("id"))
    series: dict[tuple[str, str], FlagSeries] = {}
    for r in rows:
        if r["day"] not in index:
            continue
        s = series.setdefault((r["name"], r["source"]), FlagSeries(r["name"], r["source"], [0] * days))
        s.counts[index[r["day"]]] += r["n"]
    return day_list, sorted(series.values(), key=lambda s: (-s.total, s.name))


def failure_mode_runs(*, limit: int = 20) -> list[FailureModeRun]:
    return list(FailureModeRun.objects.select_related("deployment", "created_by")[:limit])


def latest_finished_run(*, deployment: Deployment | None = None) -> FailureModeRun | None:
    qs = FailureModeRun.objects.filter(status=WorkStatus.FINISHED)
    if deployment is not None:
        qs = qs.filter(deployment=deployment)
    return qs.select_related("deployment").first()


def run_clusters(*, run: FailureModeRun) -> list[FailureCluster]:
    return list(FailureCluster.objects.filter(run=run).select_related("dismissed_by").order_by("rank"))
