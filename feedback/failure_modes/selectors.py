"""Reads for the failure-modes page: runs, their clusters, and flag counts per day."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta

from django.db.models import Count, Prefetch, Q
from django.db.models.functions import TruncDate
from django.utils import timezone

from feedback.models import (
    AnnotationQueue,
    FailureCluster,
    FailureClusterMember,
    FailureModeRun,
    Message,
    MessageRole,
    Trace,
    TraceFlag,
)
from training.serving.models import Deployment
from webapp.kernel.work import WorkStatus


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
    """The run's clusters, each with the queue made from it (`queue`, or None)."""
    clusters = list(
        FailureCluster.objects.filter(run=run)
        .select_related("dismissed_by")
        .prefetch_related(Prefetch("queues", queryset=AnnotationQueue.objects.only("id", "name", "failure_cluster")))
        .order_by("rank")
    )
    for c in clusters:
        c.queue = next(iter(c.queues.all()), None)
    return clusters


def failure_cluster_get(*, cluster_id: int) -> FailureCluster | None:
    return FailureCluster.objects.select_related("run", "run__deployment").filter(pk=cluster_id).first()


def failure_cluster_trace_ids(*, cluster: FailureCluster) -> list[int]:
    """The traces the cluster's notes are on that are still stored, newest first (the trace
    list's order)."""
    members = FailureClusterMember.objects.filter(cluster=cluster).values("trace_id")
    return list(Trace.objects.filter(pk__in=members).order_by("-started_at", "-id").values_list("pk", flat=True))


def failure_cluster_turn_ids(*, cluster: FailureCluster) -> list[int]:
    """The assistant turns the cluster's notes are about: the message each comment is on and
    each failing judgement judged. A note on a user's or a tool's message names no answer to
    replay, and a note whose comment was deleted since names nothing."""
    members = FailureClusterMember.objects.filter(cluster=cluster)
    comments = members.exclude(comment=None).values("comment__message_id")
    judged = members.exclude(judge_result=None).values("judge_result__message_id")
    turns = Message.objects.filter(role=MessageRole.ASSISTANT).filter(Q(pk__in=comments) | Q(pk__in=judged))
    return list(turns.order_by("trace_id", "position").values_list("pk", flat=True))
