"""One vocabulary for background work: every job kind's row (judge jobs, failure-mode runs,
training jobs, evaluations) moves through these statuses, so a page, a filter or a sweep
reads `finished` the same way everywhere. A kind uses the ones it needs: only training jobs
are stopped by a monitor or wind down through `cancelling`.

Releases are not work items in this sense: their statuses are the steps of putting weights
live (loading, smoke test, live), shown as such.
"""

from __future__ import annotations

from django.db import models


class WorkStatus(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    CANCELLING = "cancelling", "Cancelling"
    CANCELLED = "cancelled", "Cancelled"
    STOPPED = "stopped", "Stopped by a monitor"
    FINISHED = "finished", "Finished"
    FAILED = "failed", "Failed"


ACTIVE_WORK_STATUSES = (WorkStatus.QUEUED, WorkStatus.RUNNING, WorkStatus.CANCELLING)
