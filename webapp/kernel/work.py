"""One lifecycle for background work: judgements, judge jobs, failure-mode runs, training
jobs, evaluations and releases are `WorkItem`s, moved through the same statuses by the same
functions.

- `work_claim`: a worker takes a queued item under the row's lock, so of two deliveries of
  a queued task only one runs it. A held item is taken only by a kind that takes over: a
  training job once its worker has been silent past the stale limit; judge jobs, failure-mode
  runs and evaluations at once (`resume_after=0`), so a redelivery of a task still running
  replaces the live worker, whose later writes then change nothing; each start is counted
  (`attempts`), and a kind taking over at once fails an item past `work_attempts_exceeded`.
- `work_beat`: the heartbeat, with progress, written only while the worker still holds the
  item; it answers whether to go on (no once a cancel was asked for or the item left it).
- `work_cancel`: a queued item is cancelled at once, a running one is asked to stop.
- `work_end`: finished, failed or cancelled, only if still held: the sweep's outcome
  (`webapp/kernel/stale_work.py`) is never overwritten by a worker that was only slow.

A kind uses the statuses it needs: only training jobs are stopped by a monitor or wind down
through `cancelling`. A kind whose waiting status had its own name before the lifecycle
(a judgement is `pending`) names it in `QUEUED_STATUS`; the held and failed statuses are
always the shared ones. A kind with steps of its own keeps them in a field beside the status
(a release's `step`: loading, smoke test, switching the live pointer).

Nothing here imports an app, so every app can build on it.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, ClassVar, TypeVar

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone


class WorkStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    CANCELLING = "cancelling", "Cancelling"
    CANCELLED = "cancelled", "Cancelled"
    STOPPED = "stopped", "Stopped by a monitor"
    FINISHED = "finished", "Finished"
    FAILED = "failed", "Failed"


ACTIVE_WORK_STATUSES = (WorkStatus.QUEUED, WorkStatus.RUNNING, WorkStatus.CANCELLING)


class WorkItem(models.Model):
    """The row a background job's worker holds while it runs: the source of truth for its
    status, who runs it, its last sign of life and how it ended."""

    # The statuses in which a worker holds the item; a kind that winds down through
    # `cancelling` (training jobs checkpoint first) adds it.
    HELD_STATUSES: ClassVar[tuple[str, ...]] = (WorkStatus.RUNNING,)
    # The status an item waits in until a worker claims it.
    QUEUED_STATUS: ClassVar[str] = WorkStatus.QUEUED

    status = models.CharField(max_length=20, choices=WorkStatus.choices, default=WorkStatus.QUEUED)
    cancel_requested = models.BooleanField(default=False)
    worker = models.CharField(max_length=200, blank=True, default="")
    error = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)  # the worker's last sign of life (the sweep reads it)
    finished_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0, help_text="times a worker started or took it over")

    class Meta:
        abstract = True

    @property
    def is_active(self) -> bool:
        return self.status == self.QUEUED_STATUS or self.status in self.HELD_STATUSES


W = TypeVar("W", bound=WorkItem)


def work_worker_name(host: str | None = None) -> str:
    """A name unique to one run of one task, so a slow worker's late writes cannot touch
    an item another worker has taken over since."""
    return f"{host or socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def work_claim(
    model: type[W],
    *,
    pk: int,
    worker: str,
    resume_after: float | None = None,
    fields: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> W | None:
    """Take the item for `worker` and return it, or None when there is nothing to do: it is
    gone, over, or held by a live worker.

    A queued item is always taken. A held one is taken only by a kind that resumes: when
    its worker has been silent for over `resume_after` seconds (0: at once, a redelivered
    task takes over from the dead worker). The item is `running` again (`cancelling` if a
    cancel was asked for and the kind winds down through it), with this worker, its first
    start, a fresh heartbeat and one more of `attempts`; `fields` are written with them.
    A kind that takes over at once ends a claimed item past `work_attempts_exceeded` through
    its own failure path."""
    now = now or timezone.now()
    with transaction.atomic():
        item = model.objects.select_for_update().filter(pk=pk).first()
        if item is None:
            return None
        if item.status != model.QUEUED_STATUS:
            if resume_after is None or item.status not in model.HELD_STATUSES:
                return None
            last = item.heartbeat_at or item.started_at
            if resume_after and last is not None and last >= now - timedelta(seconds=resume_after):
                return None
        winds_down = item.cancel_requested and WorkStatus.CANCELLING in model.HELD_STATUSES
        item.status = WorkStatus.CANCELLING if winds_down else WorkStatus.RUNNING
        item.worker = worker
        item.started_at = item.started_at or now
        item.heartbeat_at = now
        item.attempts += 1
        changed = ["status", "worker", "started_at", "heartbeat_at", "attempts"]
        for name, value in (fields or {}).items():
            setattr(item, name, value)
            changed.append(name)
        item.save(update_fields=list(dict.fromkeys(changed)))
    return item


def work_attempts_exceeded(item: WorkItem, limit: int | None = None) -> str | None:
    """Why a just-claimed item must not run again, or None. A kind that takes a redelivered
    item over at once beats its heart on every redelivery, so work that kills each worker it
    reaches (out of memory, a crash in a native library) never looks silent to the sweep and
    would be redelivered forever; its count of starts is what ends it."""
    limit = settings.WORK_MAX_ATTEMPTS if limit is None else limit
    if item.attempts <= limit:
        return None
    return (
        f"started {item.attempts - 1} times and stopped mid-way each time: its workers kept dying, "
        "so it is not started again; see the worker logs"
    )


def work_held(model: type[W], *, pk: int, worker: str) -> models.QuerySet[W]:
    """The item while `worker` still holds it: empty once the sweep ended it or another
    worker took it over, so a write through it from a slow worker changes nothing."""
    return model.objects.filter(pk=pk, worker=worker, status__in=model.HELD_STATUSES)


def work_beat(model: type[W], *, pk: int, worker: str, now: datetime | None = None, **progress: Any) -> bool:
    """Beat the item's heart and write `progress` (fields, or F() expressions) while
    `worker` holds it. Returns whether the work should go on: False once a cancel was asked
    for (the progress is still written) or the item is no longer this worker's."""
    held = work_held(model, pk=pk, worker=worker)
    now = now or timezone.now()
    # One query on the usual path (held, no cancel); a cancelled item still gets its beat.
    if held.filter(cancel_requested=False).update(heartbeat_at=now, **progress):
        return True
    held.update(heartbeat_at=now, **progress)
    return False


def work_end(
    model: type[W],
    *,
    pk: int,
    worker: str | None,
    status: str,
    error: str | None = None,
    now: datetime | None = None,
    settle: Callable[[W], Iterable[str] | None] | None = None,
    on_end: Callable[[W], None] | None = None,
) -> W | None:
    """End the item with `status` (and `error`, when given) if it is still held: by
    `worker`, or by whoever holds it when `worker` is None (the sweep). An item that ended
    meanwhile keeps its outcome. Under the row's lock, `settle(item)` first sets the
    kind's own fields and names them (None: leave the item as it is); `on_end(item)` runs
    once it is saved, in the same transaction (an audit record, a log line). Returns the
    item as it now stands (None if it was deleted)."""
    with transaction.atomic():
        held = model.objects.select_for_update().filter(pk=pk, status__in=model.HELD_STATUSES)
        if worker is not None:
            held = held.filter(worker=worker)
        item = held.first()
        if item is None:
            return model.objects.filter(pk=pk).first()
        return _end(item, status=status, error=error, now=now, settle=settle, on_end=on_end)


def work_cancel(
    model: type[W],
    *,
    pk: int,
    on_end: Callable[[W], None] | None = None,
    on_asked: Callable[[W], None] | None = None,
) -> W | None:
    """Cancel the item, decided on the row as it is now (a worker may have just taken it):
    a queued one is cancelled at once (`on_end` runs); a running one is asked to stop at
    its next beat, through `cancelling` for a kind that winds down (`on_asked` runs).
    Anything else is left as it is. Returns the item as it now stands."""
    with transaction.atomic():
        item = model.objects.select_for_update().filter(pk=pk).first()
        if item is None:
            return None
        if item.status == model.QUEUED_STATUS:
            item.cancel_requested = True
            return _end(item, status=WorkStatus.CANCELLED, settle=lambda _: ["cancel_requested"], on_end=on_end)
        if item.status == WorkStatus.RUNNING and not item.cancel_requested:
            item.cancel_requested = True
            changed = ["cancel_requested"]
            if WorkStatus.CANCELLING in model.HELD_STATUSES:
                item.status = WorkStatus.CANCELLING
                changed.append("status")
            item.save(update_fields=changed)
            if on_asked is not None:
                on_asked(item)
    return item


def _end(
    item: W,
    *,
    status: str,
    error: str | None = None,
    now: datetime | None = None,
    settle: Callable[[W], Iterable[str] | None] | None = None,
    on_end: Callable[[W], None] | None = None,
) -> W:
    """End a locked item (the caller checked it may be ended)."""
    own = [] if settle is None else settle(item)
    if own is None:
        return item
    item.status = status
    item.finished_at = now or timezone.now()
    changed = ["status", "finished_at", *own]
    if error is not None:
        item.error = error
        changed.append("error")
    item.save(update_fields=list(dict.fromkeys(changed)))
    if on_end is not None:
        on_end(item)
    return item
