"""A deployment's story over time: its versions, newest first, each with when it went live,
what it learned from, its evaluation and who asked for and approved its promotion; and the
success of its live traffic per day across the versions, with the version changes marked.

A fixed number of queries whatever the number of versions (each cut by a LIMIT or by the
versions' ids): the versions, the live pointer and its changes, the training items' counts
per set (aggregated in the database), the evaluations, the promotion requests, the learning
policy runs that made them, and the day-by-version success of the live traffic.

What a version learned from is read from its training set's items' provenance: operator
comments, customer feedback, corrected responses by whom they came from, judge results,
and graded episodes. A corrected response computed from an environment's hidden answer is
an oracle label, never anybody's feedback, and is counted as such.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.db.models import Count, F, Func, IntegerField, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from feedback.models import CustomerFeedback, Grade, GradeOutcome
from training.charts import chart_spec
from training.learning_policies.models import LearningPolicyRun
from training.models import CorrectionSource, TrainingItem
from training.promotion.models import Evaluation, PromotionRequest, PromotionStatus
from training.promotion.selectors import evaluation_items_source
from training.serving.models import Deployment, LiveVersion, LiveVersionChange, ModelVersion
from webapp.kernel.work import WorkStatus
from webapp.site.selectors_measurements import OUTCOME_GRADE

MAX_VERSIONS = 50
MAX_CHANGES = 500
STORY_DAYS = (90, 30, 365)
APPROVED_STATUSES = (
    PromotionStatus.APPROVED,
    PromotionStatus.DEPLOYED,
    PromotionStatus.FAILED,
    PromotionStatus.ROLLED_BACK,
)


class _JsonKey(Func):
    """What the JSON value under `key` of a JSON column holds: its length when it is a list
    (`what="length"`), or 1 when it is a number (`what="number"`, e.g. an id); NULL otherwise,
    which SUM and COUNT leave out. PostgreSQL's jsonb and SQLite's json1 spell it differently;
    both keep the count in the database instead of reading every item's JSON."""

    output_field = IntegerField()
    _SQL = {
        ("postgresql", "length"): "CASE WHEN jsonb_typeof({x} -> %s) = 'array' THEN jsonb_array_length({x} -> %s) END",
        ("postgresql", "number"): "CASE WHEN jsonb_typeof({x} -> %s) = 'number' THEN 1 END",
        ("sqlite", "length"): "CASE WHEN json_type({x}, %s) = 'array' THEN json_array_length({x}, %s) END",
        ("sqlite", "number"): "CASE WHEN json_type({x}, %s) IN ('integer', 'real') THEN 1 END",
    }

    def __init__(self, column: str, key: str, *, what: str) -> None:
        super().__init__(F(column))
        self.key, self.what = key, what

    def as_sql(self, compiler, connection, **extra):
        template = self._SQL.get((connection.vendor, self.what))
        if template is None:
            raise NotImplementedError(f"{connection.vendor}: no JSON key {self.what} expression")
        sql, params = compiler.compile(self.source_expressions[0])
        key = self.key if connection.vendor == "postgresql" else f'$."{self.key}"'
        uses = template.count("%s")
        return f"({template.format(x=sql)})", [*params, key] * uses


@dataclass
class LearnedFrom:
    """What the training set of the job that made a version holds, by where it came from."""

    job_id: int
    job_kind: str
    training_set_id: int | None
    training_set: str
    items: int = 0
    train: int = 0
    heldout: int = 0
    comments: int = 0
    customer_feedback: int = 0
    operator_corrections: int = 0
    customer_corrections: int = 0
    judge_results: int = 0
    judge_corrections: int = 0
    oracle_labels: int = 0
    episodes: int = 0
    policy: tuple[int, str, int] | None = None  # (policy id, name, run id) when a learning policy fired it


@dataclass
class StoryEvaluation:
    id: int
    status: str
    baseline: str
    win_rate: float | None
    ci_low: float | None
    ci_high: float | None
    n: int
    held_out: str  # the held-out set's name (or the environment's episodes) it was measured on


@dataclass
class StoryPromotion:
    id: int
    status: str
    status_label: str
    requested_by: str
    requested_at: datetime
    decided_by: str
    decided_at: datetime | None
    decision_comment: str


@dataclass
class Traffic:
    """A version's live traffic in the story's window: graded outcomes and customer ratings."""

    graded: int = 0
    successes: int = 0
    rated: int = 0
    not_unhappy: int = 0

    @property
    def success_rate(self) -> float | None:
        return self.successes / self.graded if self.graded else None

    @property
    def rated_rate(self) -> float | None:
        return self.not_unhappy / self.rated if self.rated else None


@dataclass
class StoryVersion:
    version: ModelVersion
    live_now: bool
    went_live: list[tuple[datetime, str, str]]  # (when, by whom, why), newest first
    learned: LearnedFrom | None
    evaluation: StoryEvaluation | None
    promotion: StoryPromotion | None
    traffic: Traffic


@dataclass
class DayPoint:
    day: date
    version: str
    graded: int
    successes: int
    rated: int
    not_unhappy: int


@dataclass
class DeploymentStory:
    deployment: Deployment
    days: int
    first_day: date
    last_day: date
    versions: list[StoryVersion]
    points: list[DayPoint] = field(default_factory=list)
    changes: list[tuple[datetime, str]] = field(default_factory=list)  # in the window, oldest first
    more_versions: bool = False


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _story_evaluation(evaluation: Evaluation) -> StoryEvaluation:
    comparison = (evaluation.summary or {}).get("comparison") or {}
    return StoryEvaluation(
        id=evaluation.pk,
        status=evaluation.status,
        baseline=evaluation.baseline.name,
        win_rate=_number(comparison.get("win_rate")),
        ci_low=_number(comparison.get("ci_low")),
        ci_high=_number(comparison.get("ci_high")),
        n=int(_number(comparison.get("n")) or 0),
        held_out=evaluation_items_source(evaluation=evaluation),
    )


def _learned(ids: list[int]) -> dict[int, dict[str, int]]:
    """Per training set, its items counted by where they came from (one aggregate query)."""
    rows = (
        TrainingItem.objects.filter(training_set_id__in=ids)
        .values("training_set_id")
        .annotate(
            comments=Sum(_JsonKey("provenance", "comments", what="length")),
            customer_feedback=Sum(_JsonKey("provenance", "customer_feedback", what="length")),
            operator_corrections=Count("id", filter=Q(correction_source=CorrectionSource.HUMAN)),
            customer_corrections=Count("id", filter=Q(correction_source=CorrectionSource.CUSTOMER)),
            judge_corrections=Count("id", filter=Q(correction_source=CorrectionSource.JUDGE)),
            # A judge result's id; a turn nobody judged holds JSON null.
            judge_results=Count(_JsonKey("provenance", "judge_result", what="number")),
            oracle_labels=Count("id", filter=Q(provenance__labels="oracle")),
            episodes=Count("trace_id", distinct=True, filter=Q(provenance__has_key="environment")),
        )
    )
    return {r.pop("training_set_id"): {k: v or 0 for k, v in r.items()} for r in rows}


def deployment_story(
    *, deployment: Deployment, days: int = STORY_DAYS[0], now: datetime | None = None
) -> DeploymentStory:
    now = now or timezone.now()
    last_day = timezone.localdate(now)
    first_day = last_day - timedelta(days=days - 1)
    # From the first day's midnight, not `days` * 24 hours back: the curve and the totals
    # count whole days, and nothing from the day before is drawn left of the chart's axis.
    since = timezone.make_aware(datetime.combine(first_day, time.min))

    live_id = LiveVersion.objects.filter(deployment=deployment).values_list("version_id", flat=True).first()
    changes = list(
        LiveVersionChange.objects.filter(deployment=deployment)
        .select_related("to_version", "changed_by")
        .order_by("-changed_at", "-id")[:MAX_CHANGES]
    )
    # The deployment's versions: those it served, those trained or asked to go live for it.
    chosen = (
        Q(deployment=deployment)
        | Q(pk__in={c.to_version_id for c in changes} | ({live_id} if live_id else set()))
        | Q(pk__in=PromotionRequest.objects.filter(deployment=deployment).values("candidate_id"))
        | Q(produced_by_job__deployment=deployment)
    )
    rows = list(
        ModelVersion.objects.filter(chosen)
        .select_related("produced_by_job__training_set")
        .order_by("-created_at", "-id")[: MAX_VERSIONS + 1]
    )
    more = len(rows) > MAX_VERSIONS
    versions = rows[:MAX_VERSIONS]
    ids = [v.pk for v in versions]

    jobs = {v.pk: job for v in versions if (job := getattr(v, "produced_by_job", None)) is not None}
    counts = _learned([j.training_set_id for j in jobs.values() if j.training_set_id])
    policy_runs = {
        r.job_id: (r.policy_id, r.policy.name, r.pk)
        for r in LearningPolicyRun.objects.filter(job_id__in=[j.pk for j in jobs.values()]).select_related("policy")
    }

    requests: dict[int, list[PromotionRequest]] = {}
    for p in (
        PromotionRequest.objects.filter(deployment=deployment, candidate_id__in=ids)
        .select_related("requested_by", "decided_by")
        .order_by("-requested_at", "-id")
    ):
        requests.setdefault(p.candidate_id, []).append(p)
    # The request that was approved tells the version's story best; else the latest.
    promotions = {cid: next((p for p in ps if p.status in APPROVED_STATUSES), ps[0]) for cid, ps in requests.items()}
    runs: dict[int, list[Evaluation]] = {}
    for e in (
        Evaluation.objects.filter(deployment=deployment, candidate_id__in=ids)
        .select_related("baseline")
        .order_by("-created_at", "-id")
    ):
        runs.setdefault(e.candidate_id, []).append(e)
    # The evaluation its request was decided on, else the latest finished one, else the latest.
    evaluations = {}
    for cid, es in runs.items():
        asked = promotions[cid].evaluation_id if cid in promotions else None
        evaluations[cid] = next(
            (e for e in es if e.pk == asked), next((e for e in es if e.status == WorkStatus.FINISHED), es[0])
        )

    points, traffic = _traffic(deployment, since)

    story_versions = []
    for v in versions:
        job = jobs.get(v.pk)
        learned = None
        if job is not None:
            ts = job.training_set
            learned = LearnedFrom(
                job_id=job.pk,
                job_kind=job.get_kind_display(),
                training_set_id=ts.pk if ts else None,
                training_set=str(ts) if ts else "",
                items=ts.item_count if ts else 0,
                train=ts.train_count if ts else 0,
                heldout=ts.heldout_count if ts else 0,
                policy=policy_runs.get(job.pk),
                **(counts.get(ts.pk, {}) if ts else {}),
            )
        p = promotions.get(v.pk)
        e = evaluations.get(v.pk)
        story_versions.append(
            StoryVersion(
                version=v,
                live_now=v.pk == live_id,
                went_live=[
                    (c.changed_at, c.changed_by.username if c.changed_by else "", c.reason)
                    for c in changes
                    if c.to_version_id == v.pk
                ],
                learned=learned,
                evaluation=_story_evaluation(e) if e else None,
                promotion=StoryPromotion(
                    id=p.pk,
                    status=p.status,
                    status_label=p.get_status_display(),
                    requested_by=p.requested_by.username,
                    requested_at=p.requested_at,
                    decided_by=p.decided_by.username if p.decided_by else "",
                    decided_at=p.decided_at,
                    decision_comment=p.decision_comment,
                )
                if p
                else None,
                traffic=traffic.get(v.name, Traffic()),
            )
        )
    return DeploymentStory(
        deployment=deployment,
        days=days,
        first_day=first_day,
        last_day=last_day,
        versions=story_versions,
        points=points,
        changes=[(c.changed_at, c.to_version.name) for c in reversed(changes) if c.changed_at >= since],
        more_versions=more,
    )


def _traffic(deployment: Deployment, since: datetime) -> tuple[list[DayPoint], dict[str, Traffic]]:
    """Per day and serving version: graded outcomes (the `outcome` grades) and customer
    ratings (not unhappy: neither a thumbs-down nor a score of 1-2). Two queries."""
    rated = Q(rating__isnull=False) & ~Q(rating_kind="")
    unhappy = Q(rating_kind="thumbs", rating=-1) | Q(rating_kind="score", rating__lte=2)
    by_day: dict[tuple[date, str], list[int]] = {}
    grades = (
        Grade.objects.filter(deployment=deployment, name=OUTCOME_GRADE, created_at__gte=since)
        .annotate(day=TruncDate("created_at"))
        .values("day", "trace__model_version__name")
        .annotate(graded=Count("id"), successes=Count("id", filter=Q(outcome=GradeOutcome.SUCCESS)))
        .order_by()
    )
    for r in grades:
        cell = by_day.setdefault((r["day"], r["trace__model_version__name"] or "(unknown version)"), [0, 0, 0, 0])
        cell[0], cell[1] = r["graded"], r["successes"]
    ratings = (
        CustomerFeedback.objects.filter(rated, deployment=deployment, created_at__gte=since)
        .annotate(day=TruncDate("created_at"))
        .values("day", "trace__model_version__name")
        .annotate(rated=Count("id"), not_unhappy=Count("id", filter=~unhappy))
        .order_by()
    )
    for r in ratings:
        cell = by_day.setdefault((r["day"], r["trace__model_version__name"] or "(unknown version)"), [0, 0, 0, 0])
        cell[2], cell[3] = r["rated"], r["not_unhappy"]
    points, totals = [], {}
    for (day, name), (graded, successes, rated_n, not_unhappy) in sorted(by_day.items()):
        points.append(DayPoint(day, name, graded, successes, rated_n, not_unhappy))
        t = totals.setdefault(name, Traffic())
        t.graded += graded
        t.successes += successes
        t.rated += rated_n
        t.not_unhappy += not_unhappy
    return points, totals


def _day_x(day: date) -> float:
    """A day's place on a chart's time axis, where its label is: its start, in Unix seconds (UTC)."""
    return datetime.combine(day, time(0), tzinfo=UTC).timestamp()


MIN_AXIS_DAYS = 7


def story_curve(story: DeploymentStory) -> dict[str, Any]:
    """The success chart's spec (training.charts.chart_spec): a line per version (graded
    success per day, and the share of customer ratings not unhappy where there are ratings),
    a marker at each change of the live version, and a time axis that fits what is drawn —
    half a day either side of it, at least MIN_AXIS_DAYS wide around its middle — not the
    whole window: one day of traffic sits in the middle of its axis, not at the edge of 90
    days."""
    graded: dict[str, list[tuple[float, float]]] = {}
    rated: dict[str, list[tuple[float, float]]] = {}
    for p in story.points:
        x = _day_x(p.day)
        if p.graded:
            graded.setdefault(p.version, []).append((x, p.successes / p.graded))
        if p.rated:
            rated.setdefault(p.version, []).append((x, p.not_unhappy / p.rated))
    series = [{"label": f"{name} · graded success", "points": pts} for name, pts in graded.items()]
    series += [{"label": f"{name} · ratings not unhappy", "points": pts, "dash": True} for name, pts in rated.items()]
    markers = [{"x": at.timestamp(), "label": f"→ {name}"} for at, name in story.changes]
    xs = [x for s in series for x, _ in s["points"]] + [m["x"] for m in markers]
    day = 86_400.0
    if xs:
        low, high = min(xs) - day / 2, max(xs) + day / 2
        if high - low < MIN_AXIS_DAYS * day:
            middle = (low + high) / 2
            low, high = middle - MIN_AXIS_DAYS * day / 2, middle + MIN_AXIS_DAYS * day / 2
        # Centred on what is drawn even where that runs past today, the window's last day:
        # the newest traffic would otherwise always sit at the axis's edge.
        x_range = (low, high)
    else:
        x_range = None
    return chart_spec(
        chart_id="chart-story",
        title=f"Success of the live traffic per day, last {story.days} days (dashed markers: the live version changed)",
        series=series,
        x={"label": "day (UTC)", "kind": "day", **({"range": x_range} if x_range else {})},
        y={"label": "success", "format": "percent", "range": (0, 1)},
        markers=markers,
        height=260,
    )
