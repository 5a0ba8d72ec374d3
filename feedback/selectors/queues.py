"""Reads for annotation queues: the list with progress, progress per reviewer, what a
reviewer is shown on an item (its task, the queue's instructions, rubric and dimensions with
their own scores), and the scores so far per dimension."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth import get_user_model
from django.db.models import Avg, Count, Q
from django.utils import timezone

from feedback.models import (
    AnnotationQueue,
    Message,
    MessageRole,
    QueueItem,
    QueueItemStatus,
    QueueScore,
    QueueSkip,
    ScoreDimension,
    ScoreKind,
)

TASK_CHARS = 2_000  # of the user's request shown above the conversation


def queues_with_progress(limit: int = 100) -> list[AnnotationQueue]:
    """Recent queues, each with `done` and `locked` counts (one grouped query)."""
    now = timezone.now()
    return list(
        AnnotationQueue.objects.select_related("created_by").annotate(
            done=Count("items", filter=Q(items__status=QueueItemStatus.DONE)),
            locked=Count("items", filter=Q(items__status=QueueItemStatus.PENDING, items__locked_until__gt=now)),
        )[:limit]
    )


@dataclass(slots=True)
class ReviewerProgress:
    username: str
    done: int = 0
    skipped: int = 0
    holding: int = 0


def queue_progress(queue: AnnotationQueue) -> tuple[int, list[ReviewerProgress]]:
    """Items done in the queue, and per reviewer: done, skipped, currently held."""
    now = timezone.now()
    rows: dict[int, ReviewerProgress] = {}
    names = dict(
        get_user_model()
        .objects.values_list("id", "username")
        .filter(
            Q(id__in=QueueItem.objects.filter(queue=queue).values("done_by"))
            | Q(id__in=QueueItem.objects.filter(queue=queue).values("locked_by"))
            | Q(id__in=QueueSkip.objects.filter(item__queue=queue).values("user"))
        )
    )

    def row(user_id: int) -> ReviewerProgress:
        return rows.setdefault(user_id, ReviewerProgress(names.get(user_id, f"user {user_id}")))

    done_total = 0
    for user_id, n in (
        QueueItem.objects.filter(queue=queue, status=QueueItemStatus.DONE)
        .values_list("done_by")
        .annotate(n=Count("id"))
        .order_by()
    ):
        done_total += n
        if user_id is not None:
            row(user_id).done = n
    for user_id, n in (
        QueueItem.objects.filter(queue=queue, status=QueueItemStatus.PENDING, locked_until__gt=now)
        .values_list("locked_by")
        .annotate(n=Count("id"))
        .order_by()
    ):
        if user_id is not None:
            row(user_id).holding = n
    for user_id, n in (
        QueueSkip.objects.filter(item__queue=queue).values_list("user").annotate(n=Count("id")).order_by()
    ):
        row(user_id).skipped = n
    return done_total, sorted(rows.values(), key=lambda r: (-r.done, r.username))


@dataclass(slots=True)
class QueueItemRow:
    """One item of a queue as its page lists it: where it stands and whether this person may open it."""

    id: int
    position: int
    trace_label: str
    state: str  # "done", "held", "skipped" (by this person), "pending"
    who: str
    can_open: bool


def queue_items(queue: AnnotationQueue, *, user, can_browse: bool, limit: int = 500) -> list[QueueItemRow]:
    """The queue's items in order, each with its state. A reviewer opens the items they hold
    or finished; a person who may browse traces opens any."""
    now = timezone.now()
    skipped = set(QueueSkip.objects.filter(item__queue=queue, user=user).values_list("item_id", flat=True))
    rows = []
    items = (
        QueueItem.objects.filter(queue=queue)
        .select_related("done_by", "locked_by", "trace")
        .only(
            "id", "position", "status", "locked_until", "trace__external_id", "done_by__username", "locked_by__username"
        )
        .order_by("position")[:limit]
    )
    for item in items:
        held = item.status == QueueItemStatus.PENDING and item.locked_until is not None and item.locked_until > now
        if item.status == QueueItemStatus.DONE:
            state, who = "done", item.done_by.username if item.done_by else ""
        elif held:
            state, who = "held", item.locked_by.username if item.locked_by else ""
        elif item.pk in skipped:
            state, who = "skipped", user.username
        else:
            state, who = "pending", ""
        mine = (state == "done" and item.done_by_id == user.pk) or (state == "held" and item.locked_by_id == user.pk)
        label = item.trace.external_id
        rows.append(
            QueueItemRow(
                id=item.pk,
                position=item.position,
                trace_label=label if len(label) <= 60 else label[:59] + "…",
                state=state,
                who=who,
                can_open=mine or can_browse,
            )
        )
    return rows


def queue_item_neighbours(item: QueueItem, *, user) -> tuple[QueueItem | None, QueueItem | None]:
    """The items before and after `item` that this person worked on (finished, or holds now):
    what "previous item" and "next item" go back and forth between."""
    now = timezone.now()
    mine = QueueItem.objects.filter(queue_id=item.queue_id).filter(
        Q(done_by=user, status=QueueItemStatus.DONE)
        | Q(locked_by=user, locked_until__gt=now, status=QueueItemStatus.PENDING)
    )
    previous = mine.filter(position__lt=item.position).order_by("-position").only("id", "position").first()
    following = mine.filter(position__gt=item.position).order_by("position").only("id", "position").first()
    return previous, following


@dataclass(slots=True)
class DimensionField:
    """One dimension of an item's score form, with this reviewer's current answer."""

    dimension: ScoreDimension
    answer: str  # the input's value: a number, a category, "yes"/"no", or "" when unscored

    @property
    def step(self) -> str:
        d = self.dimension
        whole = d.kind == ScoreKind.NUMERIC and float(d.min_value).is_integer() and float(d.max_value).is_integer()
        return "1" if whole else "any"


@dataclass(slots=True)
class QueueBrief:
    """What a reviewer reads at the top of every item: the user's request, the queue's
    instructions and rubric, and the score form."""

    task: str
    task_position: int | None
    task_cut: bool
    fields: list[DimensionField]
    scored: int  # dimensions this reviewer has scored on this item


def queue_item_brief(*, item: QueueItem, user) -> QueueBrief:
    """The item's task (the trace's first user message: what was asked) and the score form
    with this reviewer's answers. Three queries."""
    first = (
        Message.objects.filter(trace_id=item.trace_id, role=MessageRole.USER)
        .order_by("position")
        .values_list("position", "content")
        .first()
    )
    position, task = first if first else (None, "")
    mine = {s.dimension_id: s for s in QueueScore.objects.filter(item=item, user=user)}
    fields = []
    for d in ScoreDimension.objects.filter(queue_id=item.queue_id):
        score = mine.get(d.pk)
        answer = "" if score is None else score.shown
        fields.append(DimensionField(dimension=d, answer=answer))
    return QueueBrief(
        task=task[:TASK_CHARS],
        task_position=position,
        task_cut=len(task) > TASK_CHARS,
        fields=fields,
        scored=len(mine),
    )


@dataclass(slots=True)
class DimensionSummary:
    dimension: ScoreDimension
    scores: int = 0
    mean: float | None = None  # numeric: the mean; boolean: the share of yes
    counts: list[tuple[str, int]] = field(default_factory=list)  # categorical and boolean: per answer


def queue_score_summary(queue: AnnotationQueue) -> list[DimensionSummary]:
    """Per dimension, the reviewers' scores so far: how many, the mean (share of yes), and
    the count of each answer. Two queries."""
    dimensions = list(ScoreDimension.objects.filter(queue=queue))
    rows = (
        QueueScore.objects.filter(dimension__queue=queue)
        .values("dimension_id", "label")
        .annotate(n=Count("id"), mean=Avg("value"))
        .order_by("dimension_id", "label")
    )
    by_dimension: dict[int, list[dict]] = {}
    for r in rows:
        by_dimension.setdefault(r["dimension_id"], []).append(r)
    out = []
    for d in dimensions:
        groups = by_dimension.get(d.pk, [])
        summary = DimensionSummary(dimension=d, scores=sum(g["n"] for g in groups))
        if d.kind == ScoreKind.NUMERIC and groups:
            summary.mean = sum(g["mean"] * g["n"] for g in groups) / summary.scores
        elif d.kind == ScoreKind.BOOLEAN and groups:
            summary.mean = sum(g["n"] for g in groups if g["label"] == "yes") / summary.scores
        if d.kind != ScoreKind.NUMERIC:
            answers = d.categories if d.kind == ScoreKind.CATEGORICAL else ["yes", "no"]
            counts = {g["label"]: g["n"] for g in groups}
            summary.counts = [(a, counts.get(a, 0)) for a in answers]
        out.append(summary)
    return out
