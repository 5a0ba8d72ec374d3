"""Background work whose worker died: one rule for every kind that records a heartbeat.

A row still in one of its running statuses whose `heartbeat_at` (or, before its first beat,
`started_at`) is older than the kind's silence limit is marked failed, with an error that
says how long the worker had been silent. Each row is locked and checked again before it is
changed, so a beat that arrives meanwhile wins and two sweeps fail a row once. The workers
check their row's status between steps, so a worker that was only slow stops there instead
of overwriting the outcome.

Training jobs are not failed here: they resume from a checkpoint
(`training.services.jobs.training_jobs_check_stale`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import models, transaction
from django.db.models import Q


def stale_work_fail(
    model: type[models.Model],
    *,
    running: Iterable[str],
    failed: str,
    silent_after: float,
    now: datetime,
    what: str,
    on_failed: Callable[[Any], None] | None = None,
) -> list[int]:
    """Fail the `model` rows in a `running` status silent for over `silent_after` seconds;
    `on_failed(row)` runs in the same transaction (an audit record). Returns their ids."""
    running = list(running)
    cutoff = now - timedelta(seconds=silent_after)
    silent = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)
    failed_ids: list[int] = []
    for pk in model.objects.filter(silent, status__in=running).values_list("pk", flat=True):
        with transaction.atomic():
            row = model.objects.select_for_update().filter(pk=pk).first()
            last = None if row is None else (row.heartbeat_at or row.started_at)
            if row is None or row.status not in running or last is None or last >= cutoff:
                continue
            row.status = failed
            row.error = (
                f"the worker stopped: no sign of the {what} for {int((now - last).total_seconds())} s "
                f"(the limit is {int(silent_after)} s); start it again"
            )
            row.finished_at = now
            row.save(update_fields=["status", "error", "finished_at"])
            if on_failed is not None:
                on_failed(row)
            failed_ids.append(pk)
    return failed_ids
