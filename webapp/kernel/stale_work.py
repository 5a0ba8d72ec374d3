"""Background work whose worker died: one rule for every kind of `webapp.kernel.work.WorkItem`.

An item still held (running, or cancelling) whose `heartbeat_at` (or, before its first beat,
`started_at`) is older than the kind's silence limit is ended through `work_end`, with an
error that says how long the worker had been silent: failed, or cancelled if a cancel was
already winding it down. A kind that resumes (training jobs, from their checkpoint) is
queued again instead while `resume(item)` says so. Each item is locked and checked again
before it is changed, so a beat that arrives meanwhile wins and two sweeps end an item
once; the worker's own beats and `work_end` then find the item no longer theirs, so a
worker that was only slow stops there instead of overwriting the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from django.db import transaction
from django.db.models import Q

from webapp.kernel.work import WorkItem, WorkStatus, work_end

W = TypeVar("W", bound=WorkItem)


def stale_work_settle(
    model: type[W],
    *,
    silent_after: float,
    now: datetime,
    what: str,
    on_end: Callable[[W], None] | None = None,
    resume: Callable[[W], bool] | None = None,
    on_resumed: Callable[[W], None] | None = None,
) -> list[tuple[int, str]]:
    """End (or, while `resume(item)`, queue again) the `model` items silent for over
    `silent_after` seconds. `on_end(item)` and `on_resumed(item)` run in the item's
    transaction (an audit record, a log line, the task sent again). Returns (id, what was
    done: "failed", "cancelled" or "requeued")."""
    cutoff = now - timedelta(seconds=silent_after)
    held = model.HELD_STATUSES
    silent = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)
    actions: list[tuple[int, str]] = []
    for pk in model.objects.filter(silent, status__in=held).values_list("pk", flat=True):
        with transaction.atomic():
            item = model.objects.select_for_update().filter(pk=pk, status__in=held).first()
            last = None if item is None else (item.heartbeat_at or item.started_at)
            if item is None or last is None or last >= cutoff:
                continue
            if item.status != WorkStatus.CANCELLING and resume is not None and resume(item):
                item.status, item.worker = model.QUEUED_STATUS, ""
                item.save(update_fields=["status", "worker"])
                if on_resumed is not None:
                    on_resumed(item)
                actions.append((pk, "requeued"))
                continue
            if item.status == WorkStatus.CANCELLING:
                status, error = WorkStatus.CANCELLED, None
            else:
                attempts = f" after {item.attempts} attempts" if hasattr(item, "attempts") else ""
                status = WorkStatus.FAILED
                error = (
                    f"the worker stopped: no sign of the {what} for {int((now - last).total_seconds())} s "
                    f"(the limit is {int(silent_after)} s){attempts}; start it again"
                )
            work_end(model, pk=pk, worker=None, status=status, error=error, now=now, on_end=on_end)
            actions.append((pk, str(status)))
    return actions


def stale_work_fail(
    model: type[W],
    *,
    silent_after: float,
    now: datetime,
    what: str,
    on_failed: Callable[[W], None] | None = None,
) -> list[int]:
    """`stale_work_settle` for a kind that neither resumes nor winds down: the ids failed."""
    actions = stale_work_settle(model, silent_after=silent_after, now=now, what=what, on_end=on_failed)
    return [pk for pk, _ in actions]
