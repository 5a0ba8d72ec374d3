"""Full-text search over a trace's messages.

PostgreSQL: a trace-level `search_vector` (tsvector, GIN-indexed; created by migration
0004, not a model field), queried with `websearch_to_tsquery` (words, "quoted phrases",
`or`, `-excluded`). SQLite, for demos: every word must occur, as a case-insensitive
substring, in some message of the trace.

The vector is built off the request path: ingest enqueues `feedback.search_index` after
its transaction commits, and a worker builds the vectors of the batch from the stored
messages in one statement, so a trace is searchable a moment after it is stored.
Building it inside the request halved ingest throughput with 200-byte messages and cut
it to a fifth with 4 KB ones (bench/ingest.py, side by side with the code before it):
to_tsvector is the single costliest step of storing a trace. `manage.py search_index`
builds whatever is missing (e.g. traces stored while no worker ran).

Only the first MAX_MESSAGE_CHARS of a message, and MAX_DOCUMENT_CHARS of a trace's system
messages and of its other messages, are indexed: a tsvector is capped at 1 MB, and a huge
pasted log says little past its start.

System messages have a vector of their own, `system_vector` (not indexed), and a search
looks through the conversation's vector alone unless asked to look at system messages too:
an agent's system prompt is the same on every trace ("refund" in its policy would match them
all), so by default a search does not look there. Kept apart rather than weighed inside one
vector: a weight-restricted query on one GIN index would fetch every trace whose prompt has
the word and recheck each, a scan of the table for a word of the prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import connection, transaction
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from feedback.models import Message, Trace
from feedback.tasks import search_index

logger = logging.getLogger(__name__)

SEARCH_CONFIG = "english"
MAX_MESSAGE_CHARS = 20_000
MAX_DOCUMENT_CHARS = 200_000
# A message's indexed text: its content and its tool calls' names and arguments.
_MESSAGE_TEXT = """left(m.content, %(chars)s) || coalesce(' ' || (
    SELECT string_agg(concat_ws(' ', c->'function'->>'name', c->'function'->>'arguments'), ' ')
    FROM jsonb_array_elements(m.tool_calls) AS c
), '')"""


def _vector_sql(roles: str) -> str:
    """A trace's vector from its messages `m` (grouped by trace) whose role is `roles`; NULL
    when it has none."""
    return f"""to_tsvector(%(config)s::regconfig, left(string_agg(
    {_MESSAGE_TEXT}, E'\\n' ORDER BY m.position) FILTER (WHERE {roles}), %(doc)s))"""


def traces_search_index(*, trace_ids: Sequence[int]) -> int:
    """(Re)build the search vectors of these traces from their stored messages: contents,
    tool names and tool-call arguments, system messages in a vector of their own.
    Idempotent; returns the number of traces written."""
    if connection.vendor != "postgresql" or not trace_ids:
        return 0
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {Trace._meta.db_table} AS t
            SET search_vector = coalesce(d.conversation, ''::tsvector), system_vector = d.system
            FROM (
                SELECT m.trace_id, {_vector_sql("m.role <> 'system'")} AS conversation,
                    {_vector_sql("m.role = 'system'")} AS system
                FROM {Message._meta.db_table} AS m
                WHERE m.trace_id = ANY(%(ids)s)
                GROUP BY m.trace_id
            ) AS d
            WHERE t.id = d.trace_id
            """,
            {"config": SEARCH_CONFIG, "chars": MAX_MESSAGE_CHARS, "doc": MAX_DOCUMENT_CHARS, "ids": list(trace_ids)},
        )
        return cursor.rowcount


def search_match_sql(*, table: str, include_system: bool) -> str:
    """The SQL condition of a search, with two parameters: the configuration and the words.
    With the system messages, the trace's two vectors are matched as one document (so
    "refund -policy" means what it says over the whole trace); that match is read row by
    row, not from the index."""
    query = "websearch_to_tsquery(%s::regconfig, %s)"
    if not include_system:
        return f'"{table}"."search_vector" @@ {query}'
    return f"""("{table}"."search_vector" || coalesce("{table}"."system_vector", ''::tsvector)) @@ {query}"""


def traces_search_index_later(*, trace_ids: Sequence[int]) -> None:
    """Enqueue the indexing of these traces once the current transaction commits. A broker
    that is down is logged, never fails the write: `manage.py search_index` catches up."""
    if connection.vendor != "postgresql" or not trace_ids:
        return
    ids = list(trace_ids)

    def enqueue() -> None:
        search_index.delay(ids)

    transaction.on_commit(enqueue, robust=True)


def traces_search_index_missing(*, batch: int = 1000, reindex_all: bool = False) -> int:
    """Index traces that have no vector yet (or all of them); returns how many were written."""
    if connection.vendor != "postgresql":
        return 0
    done, last = 0, 0
    while True:
        qs = Trace.objects.filter(pk__gt=last).order_by("pk")
        if not reindex_all:
            # The column is not a model field, hence raw SQL.
            qs = qs.filter(RawSQL(f'"{Trace._meta.db_table}"."search_vector" IS NULL', [], output_field=BooleanField()))
        ids = list(qs.values_list("pk", flat=True)[:batch])
        if not ids:
            return done
        done += traces_search_index(trace_ids=ids)
        last = ids[-1]
