"""API keys, traces and their messages (deployments are `training.serving`'s).

Traces are the big table (millions of rows): list pages read only the trace row,
whose denormalised counts and flags are kept up to date by the services that write
messages and feedback, and paginate by keyset on (started_at, id).

On PostgreSQL the trace table also has a `search_vector` tsvector column with a GIN
index, created by migration 0004, and a `system_vector` of its system messages (migration
0019, not indexed), both written by `feedback.services.search`. They are deliberately not
model fields: no query should fetch them, and SQLite has no such type.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from training.serving.models import Deployment, ModelVersion


class ApiKeyScope(models.TextChoices):
    INGEST = "ingest", "Ingest traces"
    FEEDBACK = "feedback", "Post customer feedback"
    READ = "read", "Read traces"
    TRAIN = "train", "Fine-tune through the OpenAI API"


class ApiKey(models.Model):
    """A deployment's API key. Only a hash of the secret is stored; the full key is
    shown once, at creation. `prefix` is the public part used to find the row."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=16, unique=True)
    hashed_secret = models.CharField(max_length=64)
    scopes = models.JSONField(default=list)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.deployment.name}: {', '.join(self.scopes)})"

    def is_active(self, *, now: timezone.datetime | None = None) -> bool:
        now = now or timezone.now()
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > now


class TraceStatus(models.TextChoices):
    OK = "ok", "OK"
    ERROR = "error", "Error"
    IN_PROGRESS = "in_progress", "In progress"


class GradeOutcome(models.TextChoices):
    """A grade's verdict, and a trace's outcome (blank: no grade yet)."""

    SUCCESS = "success", "Success"
    FAILURE = "failure", "Failure"


class TraceSource(models.TextChoices):
    INGEST = "ingest", "Batch ingest"
    GATEWAY = "gateway", "Completion gateway"
    ORCHESTRATOR = "orchestrator", "Environment episode"
    IMPORT = "import", "File import"
    OTEL = "otel", "OpenTelemetry"


class Trace(models.Model):
    """One agent episode."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="traces")
    external_id = models.CharField(max_length=200)
    session_id = models.CharField(max_length=200, blank=True, default="")
    environment = models.CharField(max_length=200, blank=True, default="")
    source = models.CharField(max_length=20, choices=TraceSource.choices, default=TraceSource.INGEST)
    # The model name as the agent reported it, and the version the gateway served it with.
    model_name = models.CharField(max_length=200, blank=True, default="")
    model_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="traces"
    )
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    status = models.CharField(max_length=20, choices=TraceStatus.choices, default=TraceStatus.OK)
    metadata = models.JSONField(default=dict, blank=True)
    tools = models.JSONField(default=list, blank=True)
    # The submitted item without its messages (each message keeps its own raw form).
    raw = models.JSONField(default=dict, blank=True)

    # Denormalised for list pages; written by the services that add messages/feedback.
    message_count = models.PositiveIntegerField(default=0)
    assistant_turn_count = models.PositiveIntegerField(default=0)
    tool_call_count = models.PositiveIntegerField(default=0)
    total_tokens = models.PositiveIntegerField(default=0)
    preview = models.CharField(max_length=300, blank=True, default="")
    has_comment = models.BooleanField(default=False)
    has_customer_feedback = models.BooleanField(default=False)
    # The least happy customer rating received: -1 negative (thumbs down, 1-2), 0 neutral (3),
    # 1 positive (thumbs up, 4-5); null when no feedback carried a rating.
    feedback_rating = models.SmallIntegerField(null=True, blank=True)
    # Written by the judge (the lowest reward over the judged turns); null until judged.
    judge_reward = models.FloatField(null=True, blank=True)
    # Written from the trace's grades (feedback.services.grades): a failure when any grade
    # failed, else a success when any passed; blank while ungraded. The reason and score are
    # the deciding grade's. Database defaults, because ingest and capture write rows by COPY
    # and name their columns.
    outcome = models.CharField(max_length=10, choices=GradeOutcome.choices, blank=True, default="", db_default="")
    outcome_reason = models.CharField(max_length=300, blank=True, default="", db_default="")
    outcome_score = models.FloatField(null=True, blank=True)
    # A fork: the trace whose history this one shares up to `forked_at` messages and then
    # leaves (an edited or rewritten history, a regenerated answer, another of `n` choices).
    forked_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks")
    forked_at = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["deployment", "external_id"], name="trace_external_id_unique"),
        ]
        indexes = [
            models.Index(fields=["deployment", "-started_at", "-id"], name="trace_dep_started_idx"),
            models.Index(fields=["-started_at", "-id"], name="trace_started_idx"),
            models.Index(fields=["deployment", "session_id"], name="trace_dep_session_idx"),
            # Partial indexes for the list filters that select a small share of traces: the
            # predicate is false on ingest, so they cost nothing there.
            models.Index(
                fields=["-started_at", "-id"], name="trace_commented_idx", condition=models.Q(has_comment=True)
            ),
            models.Index(
                fields=["-started_at", "-id"],
                name="trace_customer_fb_idx",
                condition=models.Q(has_customer_feedback=True),
            ),
            models.Index(
                fields=["feedback_rating", "-started_at", "-id"],
                name="trace_fb_rating_idx",
                condition=models.Q(feedback_rating__isnull=False),
            ),
            models.Index(
                fields=["-started_at", "-id"], name="trace_judged_idx", condition=models.Q(judge_reward__isnull=False)
            ),
            # The Outcome filter walks one outcome's traces newest first; ungraded traces (the
            # ingest default) are left out, so the index costs nothing there.
            models.Index(
                fields=["outcome", "-started_at", "-id"], name="trace_outcome_idx", condition=~models.Q(outcome="")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id}:{self.external_id}"


class MessageRole(models.TextChoices):
    SYSTEM = "system", "System"
    USER = "user", "User"
    ASSISTANT = "assistant", "Assistant"
    TOOL = "tool", "Tool"


class Message(models.Model):
    """One chat message of a trace, in the OpenAI chat format, in order (`position`).

    `content` is the text (parts joined); `content_parts` keeps the list form when one
    was submitted; `raw` is the message exactly as submitted. Assistant turns carry the
    serving data when known.
    """

    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="messages")
    position = models.PositiveIntegerField()
    role = models.CharField(max_length=20, choices=MessageRole.choices)
    content = models.TextField(blank=True, default="")
    content_parts = models.JSONField(null=True, blank=True)
    name = models.CharField(max_length=200, blank=True, default="")
    tool_calls = models.JSONField(null=True, blank=True)
    tool_call_id = models.CharField(max_length=200, blank=True, default="")
    raw = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    # Serving data for assistant turns.
    model_version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    response_id = models.CharField(max_length=200, blank=True, default="")
    token_ids = models.JSONField(null=True, blank=True)
    token_logprobs = models.JSONField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    finish_reason = models.CharField(max_length=40, blank=True, default="")
    usage = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["trace_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["trace", "position"], name="message_position_unique"),
        ]
        indexes = [
            models.Index(
                fields=["response_id"],
                name="message_response_id_idx",
                condition=~models.Q(response_id=""),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.trace_id}#{self.position} {self.role}"


class ConversationTip(models.Model):
    """Where a logged conversation can be continued: the digest of a history the gateway
    logged (a call's messages followed by its answer), and the trace that holds it. A later
    call that names no trace and whose messages start with that history continues the trace.

    Rows live `PRACTICUM_GATEWAY_STITCH_WINDOW_SECONDS` (older ones are deleted by the log
    writer); `continued` is set once a call has extended the history, so two conversations
    that happen to open identically each keep a trace of their own.
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="+", db_index=False)
    digest = models.CharField(max_length=32)  # the whole history's chained digest
    last_digest = models.CharField(max_length=20)  # the answer's own digest (finds rewritten histories)
    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="+")
    length = models.PositiveIntegerField()  # messages of the history
    continued = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["deployment", "digest", "trace"], name="conversationtip_unique"),
        ]
        indexes = [
            models.Index(fields=["deployment", "last_digest"], name="conversationtip_last_idx"),
            models.Index(fields=["created_at"], name="conversationtip_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id}:{self.digest[:12]} → {self.trace_id}"


class OtelSpan(models.Model):
    """A span an OpenTelemetry exporter sent, kept while a retry of it may still come, so it is
    taken once. Only a tool span whose call no model call has made yet keeps content (`held`:
    its call id, tool name and result, waiting for that call); every other span keeps its id
    alone (feedback/services/otlp_ingest.py)."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="+", db_index=False)
    trace_id = models.CharField(max_length=32)  # hex, as the trace's external id
    span_id = models.CharField(max_length=16)
    start_ns = models.BigIntegerField()
    data = models.JSONField()  # a held tool span's call id, name, result and size; else {}
    held = models.BooleanField(default=False)
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["deployment", "trace_id", "span_id"], name="otelspan_unique"),
        ]
        indexes = [
            models.Index(fields=["received_at"], name="otelspan_received_idx"),
            models.Index(fields=["deployment", "trace_id"], name="otelspan_held_idx", condition=models.Q(held=True)),
        ]

    def __str__(self) -> str:
        return f"{self.trace_id}/{self.span_id}"


class OtelTrace(models.Model):
    """Where an OpenTelemetry trace's ingest stands between exports: enough to extend the
    trace with the next spans without reading what it already holds. `chain` is a digest
    over its `messages` as read (a tool message by its call id), so a model call whose input
    repeats the conversation so far is recognised by hashing the input alone; `open_calls`
    are the last assistant turn's calls no tool message answers yet; `frontier_*` is the
    latest model call taken (a call that starts earlier is checked against the stored
    messages instead); `summary` is what the spans say about the whole run."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="+", db_index=False)
    external_id = models.CharField(max_length=32)  # the 32-hex trace id
    trace = models.ForeignKey(Trace, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    spans = models.PositiveIntegerField(default=0)
    messages = models.PositiveIntegerField(default=0)
    chain = models.CharField(max_length=32, blank=True, default="")  # "" until known
    open_calls = models.JSONField(default=list)  # [[call id, tool name], …]
    frontier_start_ns = models.BigIntegerField(default=-1)
    frontier_end_ns = models.BigIntegerField(default=-1)
    held = models.PositiveIntegerField(default=0)
    stored_bytes = models.BigIntegerField(default=0)  # messages written and results held, by its spans
    summary = models.JSONField(default=dict)  # times, error, session, agent, service, metadata, model
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["deployment", "external_id"], name="oteltrace_unique"),
        ]
        indexes = [models.Index(fields=["updated_at"], name="oteltrace_updated_idx")]

    def __str__(self) -> str:
        return f"{self.deployment_id}:{self.external_id}"
