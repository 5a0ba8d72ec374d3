"""What people say about traces: operators' comments, turn ratings and corrections,
customers' feedback, and failure flags written by the judge's pipeline.

Each writer keeps the trace's denormalised columns (`has_comment`,
`has_customer_feedback`, `feedback_rating`) in step through `feedback.services`.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from feedback.models.traces import ApiKey, Message, Trace
from training.serving.models import Deployment


class Comment(models.Model):
    """An operator's plain-words note on one message, optionally on a quoted span of its
    text (`quote` is `message.content[quote_start:quote_end]`, offsets in characters)."""

    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="comments")
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="comments")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    body = models.TextField()
    quote = models.TextField(blank=True, default="")
    quote_start = models.PositiveIntegerField(null=True, blank=True)
    quote_end = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    edited_at = models.DateTimeField(null=True, blank=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["created_at"], name="comment_created_idx")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(quote_start__isnull=True, quote_end__isnull=True)
                | models.Q(quote_start__isnull=False, quote_end__isnull=False, quote_start__lt=models.F("quote_end")),
                name="comment_quote_span_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"comment {self.pk} on {self.message_id}"

    @property
    def is_resolved(self) -> bool:
        return self.resolved_at is not None


class RatingKind(models.TextChoices):
    THUMBS = "thumbs", "Thumbs up/down"
    SCORE = "score", "Score 1-5"


def rating_normalised(kind: str, value: int) -> float:
    """A rating on [0, 1]: thumbs down 0, up 1; a score s as (s - 1) / 4."""
    if kind == RatingKind.THUMBS:
        return 1.0 if value > 0 else 0.0
    return (value - 1) / 4


def rating_sentiment(kind: str, value: int) -> int:
    """-1 negative (thumbs down, 1-2), 0 neutral (3), 1 positive (thumbs up, 4-5)."""
    if kind == RatingKind.THUMBS:
        return 1 if value > 0 else -1
    return -1 if value <= 2 else (0 if value == 3 else 1)


_RATING_VALID = models.Q(kind=RatingKind.THUMBS, value__in=[-1, 1]) | models.Q(
    kind=RatingKind.SCORE, value__gte=1, value__lte=5
)


class TurnRating(models.Model):
    """One person's rating of one assistant turn (thumbs: value ±1; score: 1-5). A person
    rates a turn once; rating again replaces their rating."""

    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="turn_ratings")
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="ratings")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=10, choices=RatingKind.choices)
    value = models.SmallIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["message", "user"], name="turnrating_one_per_user"),
            models.CheckConstraint(condition=_RATING_VALID, name="turnrating_value_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.kind}={self.value} on {self.message_id}"

    @property
    def normalised(self) -> float:
        return rating_normalised(self.kind, self.value)


class Correction(models.Model):
    """The response an assistant turn should have been, written by an operator. Stored
    beside the original message, which is never changed. `tool_calls` are in the chat
    format and were validated against the trace's tool definitions when written."""

    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="corrections")
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="corrections")
    author = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    content = models.TextField(blank=True, default="")
    tool_calls = models.JSONField(null=True, blank=True)
    note = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"correction {self.pk} of {self.message_id}"

    def as_openai(self) -> dict:
        """The corrected turn as a chat message."""
        out: dict = {"role": "assistant", "content": self.content or None}
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


class FeedbackSource(models.TextChoices):
    API = "api", "API"
    LINK = "link", "Feedback link"


class CustomerFeedback(models.Model):
    """Feedback a customer sent on a trace, or on one assistant turn of it (`message`,
    found through the completion id the gateway returned)."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="+")
    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="customer_feedback")
    message = models.ForeignKey(Message, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    source = models.CharField(max_length=10, choices=FeedbackSource.choices, default=FeedbackSource.API)
    rating_kind = models.CharField(max_length=10, choices=RatingKind.choices, blank=True, default="")
    rating = models.SmallIntegerField(null=True, blank=True)
    comment = models.TextField(blank=True, default="")
    correction = models.TextField(blank=True, default="")
    customer_ref = models.CharField(max_length=200, blank=True, default="")
    idempotency_key = models.CharField(max_length=200, blank=True, default="")
    # A hash of the request, so a reused idempotency key with a different body is refused.
    request_hash = models.CharField(max_length=64, blank=True, default="")
    # The feedback link this came through: a link is single-use.
    link_id = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name_plural = "customer feedback"
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["link_id"], name="customerfeedback_link_once", condition=~models.Q(link_id="")
            ),
            models.UniqueConstraint(
                fields=["deployment", "idempotency_key"],
                name="customerfeedback_idempotency",
                condition=~models.Q(idempotency_key=""),
            ),
            models.CheckConstraint(
                condition=models.Q(rating_kind="", rating__isnull=True)
                | models.Q(rating_kind=RatingKind.THUMBS, rating__in=[-1, 1])
                | models.Q(rating_kind=RatingKind.SCORE, rating__gte=1, rating__lte=5),
                name="customerfeedback_rating_valid",
            ),
        ]
        indexes = [models.Index(fields=["created_at"], name="customerfeedback_created_idx")]

    def __str__(self) -> str:
        return f"feedback {self.pk} on {self.trace_id}"

    @property
    def sentiment(self) -> int | None:
        return rating_sentiment(self.rating_kind, self.rating) if self.rating is not None else None

    @property
    def rating_normalised(self) -> float | None:
        return rating_normalised(self.rating_kind, self.rating) if self.rating is not None else None


class TraceFlag(models.Model):
    """A named failure mode seen in a trace (e.g. `wrong-tool`, `hallucinated-order`),
    written by the failure-mode pipeline or a person; the list filters on `name`.

    `trace_started_at` copies the trace's start so the list can walk one flag's traces
    newest first straight from the (name, trace_started_at, trace) index, whatever the
    size of the trace table. Write flags with `feedback.services.flags.trace_flag_set`.
    """

    # The unique (trace, name) index serves lookups by trace.
    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="flags", db_index=False)
    name = models.SlugField(max_length=100, db_index=False)
    trace_started_at = models.DateTimeField()
    source = models.CharField(max_length=40, blank=True, default="", help_text="who set it: judge, rule, user...")
    detail = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["trace", "name"], name="traceflag_unique")]
        indexes = [
            models.Index(fields=["name", "-trace_started_at", "-trace"], name="traceflag_name_started_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name} on {self.trace_id}"
