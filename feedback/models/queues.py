"""Annotation queues: a snapshot of traces chosen by a list filter, worked through by
reviewers one locked item at a time, with the queue's instructions, rubric and score
dimensions shown on every item and each reviewer's scores stored per dimension."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from feedback.models.traces import Trace


class AnnotationQueue(models.Model):
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    # What a reviewer is asked to do, and how to judge: shown at the top of every item.
    instructions = models.TextField(blank=True, default="")
    rubric = models.TextField(blank=True, default="")
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


class ScoreKind(models.TextChoices):
    NUMERIC = "numeric", "Numeric"
    CATEGORICAL = "categorical", "Categorical"
    BOOLEAN = "boolean", "Boolean"


class ScoreDimension(models.Model):
    """One thing a reviewer scores on every item of a queue, as a Langfuse score config: a
    name, a type (a number in a range, one of some categories, or yes/no) and a description
    shown beside the input."""

    queue = models.ForeignKey(AnnotationQueue, on_delete=models.CASCADE, related_name="dimensions")
    position = models.PositiveSmallIntegerField(default=0)
    name = models.SlugField(max_length=100)
    kind = models.CharField(max_length=12, choices=ScoreKind.choices)
    min_value = models.FloatField(null=True, blank=True)
    max_value = models.FloatField(null=True, blank=True)
    categories = models.JSONField(default=list, blank=True)
    description = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["queue_id", "position", "id"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "name"], name="scoredimension_name_once"),
            models.CheckConstraint(
                condition=~models.Q(kind="numeric")
                | models.Q(min_value__isnull=False, max_value__isnull=False, min_value__lt=models.F("max_value")),
                name="scoredimension_numeric_range",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.queue_id}:{self.name} ({self.kind})"

    @property
    def spec(self) -> str:
        """The dimension in the words of the queue form (`numeric 1-5`, `categorical a, b`, `boolean`)."""
        if self.kind == ScoreKind.NUMERIC:
            return f"numeric {_number(self.min_value)}-{_number(self.max_value)}"
        if self.kind == ScoreKind.CATEGORICAL:
            return "categorical " + ", ".join(self.categories)
        return "boolean"


def _number(value: float | None) -> str:
    return "" if value is None else (str(int(value)) if float(value).is_integer() else str(value))


class QueueScore(models.Model):
    """A reviewer's score of one queue item on one dimension: `value` holds a number (a
    boolean as 1 or 0), `label` a category (or "yes"/"no"). Scoring again replaces it."""

    item = models.ForeignKey(QueueItem, on_delete=models.CASCADE, related_name="scores")
    dimension = models.ForeignKey(ScoreDimension, on_delete=models.CASCADE, related_name="scores")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    value = models.FloatField(null=True, blank=True)
    label = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["item", "dimension", "user"], name="queuescore_once_per_reviewer")
        ]

    def __str__(self) -> str:
        return f"{self.dimension_id}={self.label or self.value} on {self.item_id}"

    @property
    def shown(self) -> str:
        if self.label:
            return self.label
        return _number(self.value)
