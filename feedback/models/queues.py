"""Annotation queues: a snapshot of traces chosen by a list filter, worked through by
reviewers one locked item at a time."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from feedback.models.traces import Trace


class AnnotationQueue(models.Model):
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    # The trace-list query string it was built from, as a dict of lists (shown, not re-run:
    # the items are a snapshot taken at creation).
    filters = models.JSONField(default=dict, blank=True)
    lock_minutes = models.PositiveSmallIntegerField(default=10)
    item_count = models.PositiveIntegerField(default=0)
    # The failure mode it was built from ("Review in a queue" on the failure-modes page): at
    # most one queue per cluster, so a second click opens the first one. A later run that
    # replaces the cluster leaves the queue, and its description says what it came from.
    failure_cluster = models.ForeignKey(
        "feedback.FailureCluster", null=True, blank=True, on_delete=models.SET_NULL, related_name="queues"
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("work_annotationqueue", "Can work through annotation queues")]
        constraints = [
            models.UniqueConstraint(
                fields=["failure_cluster"],
                condition=models.Q(failure_cluster__isnull=False),
                name="annotationqueue_one_per_failure_cluster",
            )
        ]

    def __str__(self) -> str:
        return self.name


class QueueItemStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DONE = "done", "Done"


class QueueItem(models.Model):
    """One trace in a queue. A reviewer who opens "next item" holds it until `locked_until`;
    after that anyone may take it."""

    queue = models.ForeignKey(AnnotationQueue, on_delete=models.CASCADE, related_name="items")
    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="+")
    position = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=QueueItemStatus.choices, default=QueueItemStatus.PENDING)
    locked_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    locked_until = models.DateTimeField(null=True, blank=True)
    done_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    done_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["queue_id", "position"]
        constraints = [models.UniqueConstraint(fields=["queue", "trace"], name="queueitem_trace_once")]
        indexes = [models.Index(fields=["queue", "status", "position"], name="queueitem_next_idx")]

    def __str__(self) -> str:
        return f"{self.queue_id}#{self.position}"


class QueueSkip(models.Model):
    """A reviewer skipped an item: it stays pending for others, not offered to them again."""

    item = models.ForeignKey(QueueItem, on_delete=models.CASCADE, related_name="skips")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["item", "user"], name="queueskip_once")]

    def __str__(self) -> str:
        return f"{self.user_id} skipped {self.item_id}"
