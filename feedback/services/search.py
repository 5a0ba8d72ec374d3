"""Full-text search over a trace's messages.

PostgreSQL: a trace-level `search_vector` (tsvector, GIN-indexed; created by migration
0004, not a model field) written when messages are stored, queried with
`websearch_to_tsquery` (words, "quoted phrases", `or`, `-excluded`). SQLite, for demos:
every word must occur, as a case-insensitive substring, in some message of the trace.

Only the first MAX_MESSAGE_CHARS of a message and MAX_DOCUMENT_CHARS of a trace are
indexed: a tsvector is capped at 1 MB, and a huge pasted log says little past its start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from django.db import connection

from feedback.models import Trace
from feedback.services.chat_format import ParsedMessage

SEARCH_CONFIG = "english"
MAX_MESSAGE_CHARS = 20_000
MAX_DOCUMENT_CHARS = 200_000
# Appends stop growing a vector past this size (bytes), well under the 1 MB limit.
MAX_VECTOR_BYTES = 600_000


def search_document(messages: Iterable[ParsedMessage]) -> str:
    """The text a trace is found by: message contents and tool calls (name and arguments)."""
    parts: list[str] = []
    size = 0
    for m in messages:
        text = m.content[:MAX_MESSAGE_CHARS]
        if m.tool_calls:
            calls = " ".join(f"{c['function']['name']} {c['function']['arguments']}" for c in m.tool_calls)
            text = f"{text} {calls[:MAX_MESSAGE_CHARS]}"
        parts.append(text)
        size += len(text) + 1
        if size >= MAX_DOCUMENT_CHARS:
            break
    return "\n".join(parts)[:MAX_DOCUMENT_CHARS]


def traces_search_index(*, documents: Sequence[tuple[int, str]], append: bool = False) -> None:
    """Set (or, with `append`, extend) the search vectors of traces: (trace id, text) pairs.
    One statement for the whole batch; a no-op on SQLite, which searches messages directly."""
    if connection.vendor != "postgresql" or not documents:
        return
    table = Trace._meta.db_table
    new = "to_tsvector(%s::regconfig, d.doc)"
    if append:
        value = (
            f"CASE WHEN coalesce(pg_column_size(t.search_vector), 0) > {MAX_VECTOR_BYTES} THEN t.search_vector "
            f"ELSE coalesce(t.search_vector, ''::tsvector) || {new} END"
        )
    else:
        value = new
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS t SET search_vector = {value} "
            "FROM unnest(%s::bigint[], %s::text[]) AS d(id, doc) WHERE t.id = d.id",
            [SEARCH_CONFIG, [i for i, _ in documents], [doc for _, doc in documents]],
        )
