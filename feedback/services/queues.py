"""Annotation queues: built from a trace-list filter, worked one locked item at a time.

"Next item" first returns the item this reviewer already holds; otherwise it claims the
first pending item whose lock is free or expired and that they have not skipped. The
claim is a conditional UPDATE, so two reviewers never hold the same item.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from feedback.failure_modes.selectors import failure_cluster_trace_ids
from feedback.models import AnnotationQueue, FailureCluster, QueueItem, QueueItemStatus, QueueSkip, Trace
from feedback.services.queue_scores import QueueItemNotHeld, queue_rubric_set
from webapp.kernel.chat_format import FieldError

MAX_QUEUE_ITEMS = 5_000


@transaction.atomic
def queue_create(
    *,
    name: str,
    traces: QuerySet[Trace],
    filters: dict[str, list[str]],
    created_by,
    limit: int = 100,
    lock_minutes: int = 10,
    description: str = "",
    failure_cluster: FailureCluster | None = None,
    instructions: str = "",
    rubric: str = "",
    dimensions: str = "",
) -> AnnotationQueue:
    """A queue of (at most `limit`) traces, in the order of the filtered list, with what its
    reviewers are asked to do: `instructions`, a `rubric` and score `dimensions` (their text,
    one a line: see feedback.services.queue_scores)."""
    name = (name or "").strip()
    if not name:
        raise FieldError("name", "required")
    if len(name) > 200:
        raise FieldError("name", "at most 200 characters")
    if not 1 <= limit <= MAX_QUEUE_ITEMS:
        raise FieldError("limit", f"from 1 to {MAX_QUEUE_ITEMS}")
    if not 1 <= lock_minutes <= 240:
        raise FieldError("lock_minutes", "from 1 to 240")
    ids = list(traces.values_list("id", flat=True)[:limit])
    if not ids:
        raise FieldError("filters", "no trace matches this filter")
    queue = AnnotationQueue.objects.create(
        name=name,
        description=(description or "").strip(),
        filters=filters,
        lock_minutes=lock_minutes,
        item_count=len(ids),
        failure_cluster=failure_cluster,
        created_by=created_by,
    )
    QueueItem.objects.bulk_create(
        [QueueItem(queue=queue, trace_id=trace_id, position=i) for i, trace_id in enumerate(ids)], batch_size=1000
    )
    if instructions or rubric or dimensions:
        queue = queue_rubric_set(queue=queue, instructions=instructions, rubric=rubric, dimensions=dimensions)
    return queue


# A run found running starts over and deletes its clusters: the page still showed this one.
REPLACED = "this failure mode is gone: its run was started over and its clusters replaced; reload the page"


@transaction.atomic
def queue_from_failure_cluster(*, cluster: FailureCluster, created_by) -> tuple[AnnotationQueue, bool]:
    """A queue of the traces a failure mode's notes are on ("Review in a queue"), newest
    first, named after the failure mode; `(queue, True)`. A cluster has one queue: asked
    again, it returns the one already made, as it stands (`(queue, False)`)."""
    # Two clicks at once wait for each other here, so the second finds the first's queue.
    locked = FailureCluster.objects.select_for_update(of=("self",)).select_related("run").filter(pk=cluster.pk).first()
    if locked is None:
        raise FieldError("cluster", REPLACED)
    cluster = locked
    existing = AnnotationQueue.objects.filter(failure_cluster=cluster).first()
    if existing is not None:
        return existing, False
    if cluster.dismissed_at is not None:
        raise FieldError("cluster", "this failure mode was dismissed as not a failure mode")
    trace_ids = failure_cluster_trace_ids(cluster=cluster)
    if not trace_ids:
        raise FieldError("cluster", "none of this failure mode's traces is stored any more")
    kept = min(len(trace_ids), MAX_QUEUE_ITEMS)
    description = (
        f"The traces of failure mode “{cluster.name}” (failure-mode run {cluster.run_id}, flag {cluster.flag_name})"
        + (f": the newest {kept} of {len(trace_ids)}." if kept < len(trace_ids) else ".")
    )
    queue = queue_create(
        name=_free_queue_name(f"Failure mode: {cluster.name}", run_id=cluster.run_id),
        traces=Trace.objects.filter(pk__in=trace_ids).order_by("-started_at", "-id"),
        filters={},
        created_by=created_by,
        limit=kept,
        description=description,
        failure_cluster=cluster,
        instructions=(
            f"Each trace here was grouped under the failure mode “{cluster.name}”. Read the conversation and "
            "say whether it shows that failure; where it does, comment on the turn that went wrong."
        ),
        dimensions="shows_failure_mode: boolean | The conversation shows this failure mode",
    )
    return queue, True


def _free_queue_name(base: str, *, run_id: int) -> str:
    """`base`, or, when a queue already has that name (an earlier run's failure mode of the
    same name), `base (run N)`, then `base (run N, 2)`…"""
    taken = set(AnnotationQueue.objects.filter(name__startswith=base).values_list("name", flat=True))
    candidates = [base, f"{base} (run {run_id})", *(f"{base} (run {run_id}, {n})" for n in range(2, len(taken) + 3))]
    return next(c for c in candidates if c not in taken)


def _free(now: datetime) -> Q:
    return Q(locked_until__isnull=True) | Q(locked_until__lte=now)


def queue_next_item(*, queue: AnnotationQueue, user, now: datetime | None = None) -> QueueItem | None:
    """Claim the next item for `user` (or return the one they hold); None when none is left."""
    now = now or timezone.now()
    until = now + timedelta(minutes=queue.lock_minutes)
    pending = QueueItem.objects.filter(queue=queue, status=QueueItemStatus.PENDING)
    held = pending.filter(locked_by=user, locked_until__gt=now).order_by("position").first()
    if held is not None:
        QueueItem.objects.filter(pk=held.pk).update(locked_until=until)
        held.locked_until = until
        return held
    for _ in range(20):
        candidate = (
            pending.filter(_free(now))
            .exclude(skips__user=user)
            .order_by("position")
            .values_list("pk", flat=True)
            .first()
        )
        if candidate is None:
            return None
        claimed = (
            QueueItem.objects.filter(pk=candidate, status=QueueItemStatus.PENDING)
            .filter(_free(now))
            .update(locked_by=user, locked_until=until)
        )
        if claimed:
            return QueueItem.objects.select_related("trace").get(pk=candidate)
    return None


def _check_holder(item: QueueItem, user, now: datetime, *, must_hold: bool = False) -> None:
    if item.status != QueueItemStatus.PENDING:
        raise QueueItemNotHeld("this item is already done")
    if item.locked_by_id != user.pk and item.locked_until is not None and item.locked_until > now:
        raise QueueItemNotHeld("another reviewer holds this item")
    if must_hold and item.locked_by_id != user.pk:
        # Done means "I reviewed this trace": only the one who took the item (with "Next
        # item") can say so. A lock that ran out still counts while nobody else took it.
        raise QueueItemNotHeld("take this item with “Next item” before marking it done")


@transaction.atomic
def queue_item_done(*, item: QueueItem, user, now: datetime | None = None) -> QueueItem:
    now = now or timezone.now()
    item = QueueItem.objects.select_for_update().get(pk=item.pk)
    _check_holder(item, user, now, must_hold=True)
    item.status = QueueItemStatus.DONE
    item.done_by, item.done_at = user, now
    item.locked_by, item.locked_until = None, None
    item.save(update_fields=["status", "done_by", "done_at", "locked_by", "locked_until"])
    return item


@transaction.atomic
def queue_item_skip(*, item: QueueItem, user, now: datetime | None = None) -> QueueItem:
    """Hand the item back for others; it is not offered to this reviewer again."""
    now = now or timezone.now()
    item = QueueItem.objects.select_for_update().get(pk=item.pk)
    _check_holder(item, user, now)
    QueueSkip.objects.get_or_create(item=item, user=user, defaults={"created_at": now})
    if item.locked_by_id == user.pk:
        item.locked_by, item.locked_until = None, None
        item.save(update_fields=["locked_by", "locked_until"])
    return item
