"""Reads for the overview page: per deployment, what happened over a recent window.

Everything is bounded: counts are over the last `days` days (each query filtered by time
on an indexed column, or cut by a LIMIT), and the graded outcomes are the latest
`max_graded`. Nothing counts a whole table.

Graded outcomes are the traces' `outcome` grades — how a harness reports a task's
programmatic grade (the demo agent does; see feedback/demo/agent.py and
feedback/services/grades.py): a success or a failure, and the reward is the grade's score
(1 or 0 when it gave none). They are attributed to the model version that served the trace.

Versions are compared like with like: each version's success is counted per split (the
trace metadata's `split`: train, heldout, test, …), and the comparison and the curve use one
split for every version — and, where the traces name their `task_id`, the tasks every
compared version ran — and say which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from django.db.models import Avg, Count, Q
from django.db.models.functions import TruncDate
from django.utils import timezone

from feedback.models import Comment, CustomerFeedback, Grade, GradeOutcome, Trace, TraceFlag
from feedback.models.judge import JudgeResult, JudgeStatus
from training.environments import environment_kinds
from training.promotion.evaluation.paired_runs import SliceSummary, slice_summaries
from training.serving.models import Deployment, LiveVersion, LiveVersionChange
from webapp.site.selectors_measurements import OUTCOME_GRADE, measured_runs

MAX_DEPLOYMENTS = 20
ROLLING = 10  # graded episodes per point of the success-rate curve
# Trace metadata `split` values of tasks no training set may contain (support-desk: test, fresh).
HELD_OUT_SPLITS = ("test", "fresh", "heldout")
NO_SPLIT = "unsplit"
# Which split the comparison uses when several hold graded episodes of as many versions:
# tasks no training saw first.
SPLIT_PREFERENCE = ("test", "heldout", "fresh", "validation", "train", NO_SPLIT)


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
    by_split: dict[str, list[int]] = field(default_factory=dict)  # split → [graded, successes]
    by_task: dict[tuple[str, str], list[int]] = field(default_factory=dict)  # (split, task) → [graded, successes]
    split_cells: list[tuple[str, int, int, float | None]] = field(default_factory=list)  # aligned with `splits`

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
class Comparison:
    """The versions side by side on one split, and on the tasks all of them ran there."""

    split: str
    rows: list[tuple[str, int, int, float | None, int, int, float | None]]  # name, n, k, rate, n_common, k_common, rate
    common_tasks: int  # tasks (by `task_id`) that every compared version ran on the split
    splits: list[str]  # the splits one could compare on instead


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
    splits: list[str] = field(default_factory=list)
    comparison: Comparison | None = None
    measured: list[SliceSummary] = field(default_factory=list)  # base vs candidate over paired runs

    @property
    def traces_total(self) -> int:
        return sum(self.traces_per_day)

    @property
    def traces_peak(self) -> int:
        return max(self.traces_per_day, default=0)


def _graded(deployment: Deployment, since: datetime, limit: int) -> list[tuple[datetime, str, bool, float, str, str]]:
    """(when, version name, success, reward, split, task id) of the latest `limit` graded
    outcomes, oldest first."""
    rows = (
        Grade.objects.filter(deployment=deployment, name=OUTCOME_GRADE, created_at__gte=since)
        .order_by("-id")
        .values_list(
            "created_at",
            "trace__model_version__name",
            "outcome",
            "score",
            "trace__metadata__split",
            "trace__metadata__task_id",
        )[:limit]
    )
    out = []
    for at, name, outcome, score, split, task in reversed(list(rows)):
        ok = outcome == GradeOutcome.SUCCESS
        reward = score if score is not None else float(ok)
        out.append((at, name or "(unknown version)", ok, reward, str(split) if split else NO_SPLIT, str(task or "")))
    return out


def _comparison_split(versions: list[VersionStats], chosen: str | None) -> str | None:
    """The split to compare on: `chosen` when some version has graded episodes there, else the
    one most versions have episodes on (ties: `SPLIT_PREFERENCE`)."""
    splits = {s for v in versions for s in v.by_split}
    if chosen in splits:
        return chosen
    if not splits:
        return None

    def rank(split: str) -> tuple[int, int, str]:
        covered = sum(1 for v in versions if split in v.by_split)
        order = SPLIT_PREFERENCE.index(split) if split in SPLIT_PREFERENCE else len(SPLIT_PREFERENCE)
        return (-covered, order, split)

    return min(splits, key=rank)


def _comparison(versions: list[VersionStats], split: str | None) -> Comparison | None:
    if split is None:
        return None
    compared = [v for v in versions if split in v.by_split]
    task_sets = [{t for (s, t) in v.by_task if s == split and t} for v in compared]
    common = set.intersection(*task_sets) if task_sets else set()
    rows = []
    for v in compared:
        n, k = v.by_split[split]
        cn = sum(v.by_task[(split, t)][0] for t in common)
        ck = sum(v.by_task[(split, t)][1] for t in common)
        rows.append((v.name, n, k, k / n if n else None, cn, ck, ck / cn if cn else None))
    splits = sorted({s for v in versions for s in v.by_split}, key=lambda s: (s not in SPLIT_PREFERENCE, s))
    return Comparison(split=split, rows=rows, common_tasks=len(common), splits=splits)


def deployment_overview(
    *,
    deployment: Deployment,
    days: int = 14,
    now: datetime | None = None,
    max_graded: int = 500,
    split: str | None = None,
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
        positive=Count("id", filter=Q(rating_kind="thumbs", rating=1) | Q(rating_kind="score", rating__gte=4)),
        negative=Count("id", filter=Q(rating_kind="thumbs", rating=-1) | Q(rating_kind="score", rating__lte=2)),
        total=Count("id"),
    )
    grades = Grade.objects.filter(deployment=deployment, name=OUTCOME_GRADE, created_at__gte=since).aggregate(
        success=Count("id", filter=Q(outcome=GradeOutcome.SUCCESS)),
        failure=Count("id", filter=Q(outcome=GradeOutcome.FAILURE)),
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
    graded = _graded(deployment, since, max_graded)
    for at, name, success, reward, graded_split, task in graded:
        v = versions.setdefault(name, VersionStats(name=name, first_at=at))
        ok = int(success)
        v.graded += 1
        v.successes += ok
        v.heldout += int(graded_split in HELD_OUT_SPLITS)
        v.heldout_successes += int(graded_split in HELD_OUT_SPLITS and ok)
        v.reward_sum += reward
        v.last_at = at
        cell = v.by_split.setdefault(graded_split, [0, 0])
        cell[0], cell[1] = cell[0] + 1, cell[1] + ok
        per_task = v.by_task.setdefault((graded_split, task), [0, 0])
        per_task[0], per_task[1] = per_task[0] + 1, per_task[1] + ok
    # The curve compares like with like: every version on the comparison's split only.
    compare_on = _comparison_split(list(versions.values()), split)
    curve: list[CurvePoint] = []
    recent: dict[str, list[int]] = {}
    for _, name, success, _, graded_split, _ in graded:
        if graded_split != compare_on:
            continue
        window = recent.setdefault(name, [])
        window.append(int(success))
        del window[:-ROLLING]
        curve.append(CurvePoint(index=len(curve) + 1, version=name, rate=sum(window) / len(window)))
    for row in judged:
        name = row["trace__model_version__name"] or "(unknown version)"
        v = versions.setdefault(name, VersionStats(name=name))
        v.judged, v.judge_reward = row["n"], row["reward"]
    live_name = live.version.name if live else None
    if live_name:
        versions.setdefault(live_name, VersionStats(name=live_name))
        versions[live_name].live = True
    ordered = sorted(versions.values(), key=lambda v: (v.first_at is None, v.first_at or now, v.name))
    splits = sorted({s for v in ordered for s in v.by_split}, key=lambda s: (s not in SPLIT_PREFERENCE, s))
    for v in ordered:
        v.split_cells = [
            (s, *v.by_split.get(s, [0, 0]), (lambda c: c[1] / c[0] if c[0] else None)(v.by_split.get(s, [0, 0])))
            for s in splits
        ]
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
        graded_success=grades["success"],
        graded_failure=grades["failure"],
        judged=sum(r["n"] for r in judged),
        failure_modes=[(r["name"], r["n"]) for r in flags],
        versions=ordered,
        curve=curve,
        flips=flips,
        splits=splits,
        comparison=_comparison(ordered, compare_on),
        measured=slice_summaries(*measured_runs(deployment=deployment.name, days=days), labels=environment_kinds()),
    )


def deployments_overview(
    *, days: int = 14, now: datetime | None = None, split: str | None = None
) -> list[DeploymentOverview]:
    """The overview of each deployment (the first MAX_DEPLOYMENTS by name), each version
    compared on `split` where it has graded episodes there."""
    return [
        deployment_overview(deployment=d, days=days, now=now, split=split)
        for d in Deployment.objects.order_by("name")[:MAX_DEPLOYMENTS]
    ]
