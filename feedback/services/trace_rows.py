"""Writing trace and message rows in bulk: one COPY per table on PostgreSQL (a bulk insert
elsewhere), JSON serialised once with orjson, and NUL taken out of untrusted text first
(`strip_nul`, webapp/kernel/nul.py: PostgreSQL text and jsonb cannot hold it). Every source of traces (batch
ingest, the gateway's capture, OTLP) writes through here."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import orjson
from django.db import connection

from feedback.models import Message, Trace
from feedback.services.search import traces_search_index_later
from webapp.kernel.chat_format import ParsedMessage
from webapp.kernel.nul import strip_nul

MESSAGE_COLUMNS = (
    "trace_id",
    "position",
    "role",
    "content",
    "content_parts",
    "name",
    "tool_calls",
    "tool_call_id",
    "raw",
    "created_at",
    "response_id",
    "token_ids",
    "token_logprobs",
    "latency_ms",
    "finish_reason",
    "usage",
    "model_version_id",
)
_MESSAGE_JSON = {"content_parts", "tool_calls", "raw", "token_ids", "token_logprobs", "usage"}
TRACE_COLUMNS = (
    "id",
    "deployment_id",
    "external_id",
    "session_id",
    "environment",
    "source",
    "model_name",
    "model_version_id",
    "started_at",
    "ended_at",
    "created_at",
    "updated_at",
    "status",
    "metadata",
    "tools",
    "raw",
    "message_count",
    "assistant_turn_count",
    "tool_call_count",
    "total_tokens",
    "preview",
    "has_comment",
    "has_customer_feedback",
    "forked_from_id",
    "forked_at",
)
_TRACE_JSON = {"metadata", "tools", "raw"}


def message_row(*, trace_id: int, position: int, message: ParsedMessage, now: datetime) -> tuple:
    """One message row as a tuple in MESSAGE_COLUMNS order (no model instance: the hot path),
    for `messages_insert`. Batch ingest and gateway capture both build rows with it, so both
    paths store the same columns."""
    m = message
    s = m.serving
    latency = s.get("latency_ms")
    return (
        trace_id,
        position,
        m.role,
        m.content,
        m.content_parts,
        m.name,
        m.tool_calls,
        m.tool_call_id,
        m.raw,
        now,
        str(s.get("response_id", ""))[:200],
        s.get("token_ids"),
        s.get("token_logprobs"),
        float(latency) if isinstance(latency, int | float) else None,
        str(s.get("finish_reason", ""))[:40],
        s.get("usage"),
        s.get("model_version_id"),
    )


def _copy(table: str, columns: Sequence[str], json_columns: set[str], rows: Iterable[tuple]) -> None:
    """COPY rows into a table; JSON values are serialised here with orjson (psycopg's own
    JSON dumper uses the standard library, several times slower on large batches)."""
    json_at = [i for i, c in enumerate(columns) if c in json_columns]
    text_at = [i for i, c in enumerate(columns) if c not in json_columns]
    dumps = orjson.dumps
    sql = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
    # The raw psycopg cursor bypasses Django's error translation: without it a unique
    # violation from a concurrent batch surfaces as psycopg's UniqueViolation, not as the
    # IntegrityError `traces_ingest` retries on.
    with connection.wrap_database_errors, connection.cursor() as cursor, cursor.cursor.copy(sql) as copy:
        for row in rows:
            row = list(row)
            for i in json_at:
                if row[i] is not None:
                    dumped = dumps(row[i])
                    if b"\\u0000" in dumped:
                        dumped = dumps(strip_nul(row[i]))
                    row[i] = dumped.decode()
            for i in text_at:
                value = row[i]
                if value.__class__ is str and "\x00" in value:
                    row[i] = strip_nul(value)
            copy.write_row(row)


def messages_insert(rows: Sequence[tuple]) -> None:
    """Insert message rows (MESSAGE_COLUMNS tuples); on PostgreSQL through COPY. Every
    writer of messages comes here, so here their traces are queued for search indexing."""
    if not rows:
        return
    if connection.vendor == "postgresql":
        _copy(Message._meta.db_table, MESSAGE_COLUMNS, _MESSAGE_JSON, rows)
        traces_search_index_later(trace_ids=sorted({r[0] for r in rows}))
    else:
        Message.objects.bulk_create(
            [Message(**dict(zip(MESSAGE_COLUMNS, r, strict=True))) for r in rows], batch_size=500
        )


def traces_insert(rows: list[dict[str, Any]]) -> list[int]:
    """Insert trace rows (dicts of TRACE_COLUMNS without id); returns their ids in order."""
    if not rows:
        return []
    if connection.vendor != "postgresql":
        objs = Trace.objects.bulk_create([Trace(**r) for r in rows])
        return [o.id for o in objs]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
            [Trace._meta.db_table, len(rows)],
        )
        ids = [r[0] for r in cursor.fetchall()]
    _copy(
        Trace._meta.db_table,
        TRACE_COLUMNS,
        _TRACE_JSON,
        ((i, *(r.get(c) for c in TRACE_COLUMNS[1:])) for i, r in zip(ids, rows, strict=True)),
    )
    return ids
