"""Writing traces: batch ingest, idempotent on (deployment, external_id).

Resending a trace is safe. If its messages equal what is stored (or are a prefix of
it) the result is `exists`; if the stored messages are a prefix of the new ones, the
new messages are appended (`appended`) — an agent may resend a growing conversation.
A resend whose messages differ from the stored ones at some position is refused with
the position and reason: stored history is never rewritten.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, OperationalError, transaction
from django.utils import timezone

from feedback.models import Trace, TraceSource, TraceStatus
from feedback.services.grades import GradeIn, grades_parse, grades_write
from feedback.services.trace_rows import message_row, messages_insert, traces_insert
from training.serving.models import Deployment
from webapp.kernel.chat_format import (
    SERVING_KEYS,
    FieldError,
    ParsedMessage,
    json_depth_check,
    optional_string,
    parse_message,
    parse_timestamp,
    parse_tools,
)
from webapp.kernel.nul import strip_nul

PREVIEW_CHARS = 300


@dataclass(slots=True)
class ParsedTrace:
    external_id: str
    messages: list[ParsedMessage]
    tools: list[dict[str, Any]]
    session_id: str
    environment: str
    model_name: str
    metadata: dict[str, Any]
    started_at: datetime | None
    ended_at: datetime | None
    status: str
    raw: dict[str, Any]
    grades: list[GradeIn] = field(default_factory=list)


@dataclass(slots=True)
class ItemResult:
    index: int
    external_id: str | None
    status: str  # created | exists | appended | error
    trace_id: int | None = None
    errors: list[dict[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "external_id": self.external_id, "status": self.status}
        if self.trace_id is not None:
            out["id"] = self.trace_id
        if self.errors:
            out["errors"] = self.errors
        return out


def parse_trace_item(item: Any, *, max_messages: int | None = None) -> ParsedTrace:
    """Validate one submitted trace; raises `FieldError` with the field and reason."""
    if not isinstance(item, dict):
        raise FieldError("", "each trace must be an object")
    max_messages = max_messages or settings.INGEST_MAX_MESSAGES_PER_TRACE
    external_id = item.get("external_id")
    if not isinstance(external_id, str) or not external_id.strip():
        raise FieldError("external_id", "required non-empty string")
    if len(external_id) > 200:
        raise FieldError("external_id", "longer than 200 characters")
    if "\x00" in external_id:
        # It is looked up as it is, and PostgreSQL text cannot hold NUL: refuse this item
        # rather than fail the batch's query.
        raise FieldError("external_id", "contains a NUL character")
    raw_messages = item.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise FieldError("messages", "required non-empty array of chat messages")
    if len(raw_messages) > max_messages:
        raise FieldError("messages", f"{len(raw_messages)} messages; at most {max_messages} per trace")
    messages = [parse_message(m, f"messages[{i}]") for i, m in enumerate(raw_messages)]
    tools = parse_tools(item["tools"], "tools") if item.get("tools") is not None else []
    metadata = item.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise FieldError("metadata", "must be an object")
    grades = grades_parse(item.get("grades"))
    for key, value in item.items():
        # Each message, tool and grade is checked as it is parsed.
        if key not in ("messages", "tools", "grades") and isinstance(value, dict | list):
            json_depth_check(value, str(key)[:100])
    status = item.get("status") or TraceStatus.OK
    if status not in TraceStatus.values:
        raise FieldError("status", f"one of {', '.join(TraceStatus.values)}")
    started_at = parse_timestamp(item.get("started_at"), "started_at")
    ended_at = parse_timestamp(item.get("ended_at"), "ended_at")
    if started_at and ended_at and ended_at < started_at:
        raise FieldError("ended_at", "earlier than started_at")
    return ParsedTrace(
        external_id=external_id,
        messages=messages,
        tools=tools,
        session_id=optional_string(item, "session_id"),
        environment=optional_string(item, "environment"),
        model_name=optional_string(item, "model"),
        metadata=metadata,
        started_at=started_at,
        ended_at=ended_at,
        status=status,
        raw={k: v for k, v in item.items() if k not in ("messages", "grades")},
        grades=grades,
    )


def trace_counts(messages: Iterable[ParsedMessage]) -> dict[str, Any]:
    """The denormalised columns a list page reads, computed from messages."""
    counts = {"message_count": 0, "assistant_turn_count": 0, "tool_call_count": 0, "total_tokens": 0}
    preview = ""
    for m in messages:
        counts["message_count"] += 1
        if m.role == "assistant":
            counts["assistant_turn_count"] += 1
            usage = m.serving.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("total_tokens"), int):
                counts["total_tokens"] += usage["total_tokens"]
        if m.tool_calls:
            counts["tool_call_count"] += len(m.tool_calls)
        if not preview and m.role == "user" and m.content:
            preview = m.content[:PREVIEW_CHARS]
    counts["preview"] = preview
    return counts


def _divergence(stored: list[dict[str, Any]], new: list[ParsedMessage]) -> int | None:
    """The first position where the new messages say something other than the stored ones,
    if any. Serving data is compared where both carry it: a resend that leaves it out (an
    OpenTelemetry model call's input repeats the earlier turns bare), or a turn first stored
    bare and resent with it, is the same turn; different serving data (token ids, latency)
    on both sides is a rewrite. Stored text has NUL replaced (see
    `strip_nul`): the new messages are compared the same way."""
    for i, (old, m) in enumerate(zip(stored, new, strict=False)):
        new_raw = strip_nul(m.raw)
        if _said(old, new_raw) != _said(new_raw, old):
            return i
    return None


def _said(message: Any, other: Any) -> Any:
    """`message` without the serving keys `other` does not carry: serving data is compared
    only where both sides have it (where both do, it must agree)."""
    if not isinstance(message, dict) or not isinstance(other, dict):
        return message
    return {k: v for k, v in message.items() if k not in SERVING_KEYS or k in other}


@transaction.atomic
def _ingest_parsed(deployment: Deployment, parsed: list[tuple[int, ParsedTrace]], source: str) -> list[ItemResult]:
    now = timezone.now()
    by_id = {p.external_id: (i, p) for i, p in parsed}
    # Stored traces this batch may extend are locked (in id order, so two batches never
    # wait on each other crosswise) before their messages are read: a concurrent append to
    # the same trace waits here and then sees this one's messages and counts.
    existing = {
        t.external_id: t
        for t in Trace.objects.select_for_update()
        .filter(deployment=deployment, external_id__in=list(by_id))
        .order_by("id")
        .only(
            "id",
            "external_id",
            "message_count",
            "metadata",
            "assistant_turn_count",
            "tool_call_count",
            "total_tokens",
            "preview",
        )
    }
    results: list[ItemResult] = []
    grades: list[tuple[int, GradeIn]] = []  # (trace id, grade): a resend may grade a stored trace
    new_traces: list[tuple[int, ParsedTrace, dict[str, Any]]] = []
    for index, p in parsed:
        if p.external_id in existing:
            continue
        new_traces.append(
            (
                index,
                p,
                {
                    "deployment_id": deployment.id,
                    "external_id": p.external_id,
                    "session_id": p.session_id,
                    "environment": p.environment,
                    "source": source,
                    "model_name": p.model_name,
                    "started_at": p.started_at or now,
                    "ended_at": p.ended_at,
                    "created_at": now,
                    "updated_at": now,
                    "status": p.status,
                    "metadata": p.metadata,
                    "tools": p.tools,
                    "raw": p.raw,
                    "has_comment": False,
                    "has_customer_feedback": False,
                    **trace_counts(p.messages),
                },
            )
        )
    ids = traces_insert([row for _, _, row in new_traces])
    rows: list[tuple] = []
    for (index, p, _), trace_id in zip(new_traces, ids, strict=True):
        rows.extend(
            message_row(trace_id=trace_id, position=pos, message=m, now=now) for pos, m in enumerate(p.messages)
        )
        results.append(ItemResult(index, p.external_id, "created", trace_id))
        grades.extend((trace_id, g) for g in p.grades)

    for external_id, trace in existing.items():
        index, p = by_id[external_id]
        stored = list(trace.messages.order_by("position").values_list("raw", flat=True))
        at = _divergence(stored, p.messages)
        if at is not None:
            results.append(
                ItemResult(
                    index,
                    external_id,
                    "error",
                    trace.id,
                    [
                        {
                            "field": f"messages[{at}]",
                            "reason": "differs from the stored message at this position; a stored trace "
                            "can only be extended with new messages, not rewritten",
                        }
                    ],
                )
            )
            continue
        extra = p.messages[len(stored) :]
        grades.extend((trace.id, g) for g in p.grades)
        if not extra:
            results.append(ItemResult(index, external_id, "exists", trace.id))
            continue
        rows.extend(
            message_row(trace_id=trace.id, position=len(stored) + k, message=m, now=now) for k, m in enumerate(extra)
        )
        _apply_appended(trace, extra, p, now, stored_count=len(stored))
        results.append(ItemResult(index, external_id, "appended", trace.id))
    messages_insert(rows)
    grades_write(deployment_id=deployment.id, grades=grades, now=now)
    return results


def _apply_appended(
    trace: Trace, extra: list[ParsedMessage], p: ParsedTrace | None, now: datetime, *, stored_count: int | None = None
) -> None:
    add = trace_counts(extra)
    # With the stored messages just counted under the row lock, the count is set, not added
    # to, so it always equals the rows that exist.
    base = trace.message_count if stored_count is None else stored_count
    trace.message_count = base + add["message_count"]
    trace.assistant_turn_count += add["assistant_turn_count"]
    trace.tool_call_count += add["tool_call_count"]
    trace.total_tokens += add["total_tokens"]
    trace.preview = trace.preview or add["preview"]
    trace.updated_at = now
    fields = ["message_count", "assistant_turn_count", "tool_call_count", "total_tokens", "preview", "updated_at"]
    if p is not None:
        trace.metadata = strip_nul({**trace.metadata, **p.metadata})
        trace.status = p.status
        fields += ["metadata", "status"]
        if p.ended_at:
            trace.ended_at = p.ended_at
            fields.append("ended_at")
    trace.save(update_fields=fields)


def traces_ingest(
    *, deployment: Deployment, items: Sequence[Any], source: str = TraceSource.INGEST
) -> list[ItemResult]:
    """Store a batch of traces; every item gets a result, a bad item never loses the others.

    Valid items are written in one transaction; each trace with all its messages or not at all.
    """
    results: dict[int, ItemResult] = {}
    parsed: list[tuple[int, ParsedTrace]] = []
    seen: set[str] = set()
    for index, item in enumerate(items):
        external_id = item.get("external_id") if isinstance(item, dict) else None
        external_id = external_id if isinstance(external_id, str) else None
        try:
            p = parse_trace_item(item)
        except FieldError as exc:
            results[index] = ItemResult(index, external_id, "error", errors=[exc.as_dict()])
            continue
        if p.external_id in seen:
            results[index] = ItemResult(
                index,
                external_id,
                "error",
                errors=[
                    {
                        "field": "external_id",
                        "reason": "appears more than once in this batch",
                    }
                ],
            )
            continue
        seen.add(p.external_id)
        parsed.append((index, p))
    if parsed:
        written = _ingest_with_retries(deployment, parsed, source)
        for r in written:
            results[r.index] = r
    return [results[i] for i in sorted(results)]


# How often a batch is written again after losing a race with a concurrent one.
INGEST_ATTEMPTS = 4
_RETRYABLE_SQLSTATES = {"40P01", "40001"}  # deadlock detected, serialization failure


def _ingest_with_retries(
    deployment: Deployment, parsed: list[tuple[int, ParsedTrace]], source: str
) -> list[ItemResult]:
    """A concurrent request may create some of these external ids first (a unique violation)
    or, rarely, the two may deadlock; the whole batch was rolled back, so it is written
    again, and the next pass sees those traces as stored and compares instead of inserting."""
    for attempt in range(1, INGEST_ATTEMPTS + 1):
        try:
            return _ingest_parsed(deployment, parsed, source)
        except (IntegrityError, OperationalError) as exc:
            retryable = isinstance(exc, IntegrityError) or (
                getattr(exc.__cause__, "sqlstate", None) in _RETRYABLE_SQLSTATES
            )
            if not retryable or attempt == INGEST_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


@transaction.atomic
def trace_append_messages(*, trace: Trace, messages: Sequence[ParsedMessage]) -> int:
    """Append already-validated messages to a trace and keep its counts in step; returns
    the position of the first appended message."""
    trace = Trace.objects.select_for_update().get(pk=trace.pk)
    now = timezone.now()
    first = trace.message_count
    messages_insert(
        [message_row(trace_id=trace.id, position=first + k, message=m, now=now) for k, m in enumerate(messages)]
    )
    _apply_appended(trace, list(messages), None, now)
    return first
