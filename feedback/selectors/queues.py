"""Reads for annotation queues: the list with progress, and progress per reviewer."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db.models import Count, Q
from django.utils import timezone

from feedback.models import AnnotationQueue, QueueItem, QueueItemStatus, QueueSkip


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
