"""Writing what the completion gateway saw: each exchange becomes messages of a trace.

Chat clients resend the whole conversation on every call. An exchange is matched against
the trace it names (the `X-Practicum-Trace-Id` header or `metadata.trace_id`) by the same
prefix rule as batch ingest: messages the trace already holds are skipped, the rest is
appended, followed by the assistant's answer with its serving data (version, token ids,
per-token log-probs, latency, finish reason, usage).

Messages are compared by meaning (role, text, tool calls, tool call id, name), not by their
exact JSON, since SDKs re-serialise what they send back (`refusal: null`, reordered keys).
Turns the client never received whole — a failed call, a stream the client left — stay in
the trace, marked by `finish_reason` (`error`, `client_disconnect`), and are ignored when
matching, so a retry simply continues the trace.

An exchange that names no trace, for a deployment that stitches conversations, goes to the
trace whose logged history its messages start with (`feedback/services/stitching.py`), and is
then placed by the same rule; without a match, or with stitching off, it starts a new trace.

When the history diverges from the stored one (an edited message, a regenerated answer,
another of the `n` choices), the exchange goes to a fork: a trace named
`<trace id>~<position>.<digest of the first differing message>` in the same session, holding
the whole history. The name is a pure function of the history, so a client that keeps
sending the original trace id keeps extending the same fork; nothing stored is rewritten.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from django.db import connection, transaction
from django.utils import timezone

from feedback.gateway.exchange import Exchange, ExchangeStatus
from feedback.models import Message, Trace, TraceSource, TraceStatus
from feedback.services.assistant_turns import exchange_assistant_turns
from feedback.services.ingest import trace_counts
from feedback.services.message_digests import UNSEEN_FINISH_REASONS, message_digest, parsed_digest
from feedback.services.stitching import Stitcher
from feedback.services.trace_rows import message_row, messages_insert, traces_insert
from webapp.kernel.chat_format import ParsedMessage
from webapp.kernel.nul import strip_nul

MAX_FORK_DEPTH = 16
TRACE_KEY_MAX = 200


def fork_key(root: str, position: int, digest: str) -> str:
    suffix = f"~{position}.{digest[:12]}"
    return root[: TRACE_KEY_MAX - len(suffix)] + suffix


def exchange_ended_at(ex: Exchange) -> datetime:
    """When an exchange's answer was complete: its start plus its latency (a gateway trace
    ends with its last answer)."""
    return datetime.fromtimestamp(ex.started_at + ex.latency_ms / 1000.0, tz=UTC)


def new_trace_key() -> str:
    return f"gw-{uuid.uuid4().hex}"


@dataclass(slots=True)
class _TraceState:
    id: int | None
    digests: list[str | None]  # one per stored position; None for a turn the client never saw
    obj: Trace | None = None  # an existing row (its counts are updated)
    row: dict[str, Any] | None = None  # a new row (inserted at the end of the batch)
    appended: list[ParsedMessage] = field(default_factory=list)
    last: Exchange | None = None
    fork: tuple[str, int | None] | None = None  # a new fork: its parent's key and the position it leaves at


class TraceDigestCache:
    """Per-process LRU of stored traces' message digests, so matching a long conversation
    does not re-read its messages on every call. Validated by `message_count` on each use."""

    def __init__(self, size: int = 20000) -> None:
        self.size = size
        self._items: OrderedDict[tuple[int, str], tuple[int, list[str | None]]] = OrderedDict()

    def get(self, key: tuple[int, str], trace_id: int, count: int) -> list[str | None] | None:
        item = self._items.get(key)
        if item is None or item[0] != trace_id or len(item[1]) != count:
            return None
        self._items.move_to_end(key)
        return list(item[1])

    def put(self, key: tuple[int, str], trace_id: int, digests: list[str | None]) -> None:
        self._items[key] = (trace_id, digests)
        self._items.move_to_end(key)
        while len(self._items) > self.size:
            self._items.popitem(last=False)

    def clear(self) -> None:
        self._items.clear()


class _Batch:
    def __init__(self, cache: TraceDigestCache, now: datetime) -> None:
        self.cache = cache
        self.now = now
        self.states: dict[tuple[int, str], _TraceState | None] = {}

    def load(self, deployment_id: int, keys: Sequence[str]) -> None:
        missing = [k for k in keys if (deployment_id, k) not in self.states]
        if not missing:
            return
        rows = (
            Trace.objects.select_for_update()
            .filter(deployment_id=deployment_id, external_id__in=missing)
            .order_by("id")  # one lock order for every writer process
            .only(
                "id",
                "external_id",
                "session_id",
                "status",
                "model_version_id",
                "tools",
                "preview",
                "ended_at",
                *_COUNTS,
            )
        )
        found = {t.external_id: t for t in rows}
        for key in missing:
            trace = found.get(key)
            if trace is None:
                self.states[(deployment_id, key)] = None
                continue
            digests = self.cache.get((deployment_id, key), trace.id, trace.message_count)
            if digests is None:
                digests = [
                    None
                    if role == "assistant" and finish in UNSEEN_FINISH_REASONS
                    else message_digest(role, content, calls, call_id, name)
                    for role, content, calls, call_id, name, finish in Message.objects.filter(trace_id=trace.id)
                    .order_by("position")
                    .values_list("role", "content", "tool_calls", "tool_call_id", "name", "finish_reason")
                ]
            self.states[(deployment_id, key)] = _TraceState(id=trace.id, digests=digests, obj=trace)

    def create(self, ex: Exchange, key: str, messages: list[ParsedMessage], fork: dict[str, Any] | None) -> None:
        metadata = dict(ex.metadata)
        session_id = ex.session_id
        if fork is not None:
            metadata["forked_from"] = fork["from"]
            metadata["forked_at"] = fork["position"]
            if fork.get("rewritten"):
                metadata["rewritten_history"] = True
            session_id = session_id or fork.get("session", "")
        started = datetime.fromtimestamp(ex.started_at, tz=UTC)
        row = {
            "deployment_id": ex.deployment_id,
            "external_id": key,
            "session_id": session_id[:200],
            "environment": str(ex.metadata.get("environment", ""))[:200],
            "source": TraceSource.GATEWAY,
            "model_name": ex.requested_model[:200],
            "model_version_id": ex.version_id,
            "started_at": started,
            "ended_at": exchange_ended_at(ex),
            "created_at": self.now,
            "updated_at": self.now,
            "status": TraceStatus.ERROR if ex.status == ExchangeStatus.ERROR else TraceStatus.OK,
            "metadata": metadata,
            "tools": ex.tools,
            # Whether the gateway chose this trace's id (a call that named no trace): only such
            # traces may be joined later by `stitch_traces`; a client's id is never touched,
            # whatever it looks like.
            "raw": {
                "model": ex.requested_model,
                "params": ex.params,
                "named_by_gateway": not ex.explicit_trace and fork is None,
            },
            "has_comment": False,
            "has_customer_feedback": False,
        }
        state = _TraceState(id=None, digests=[parsed_digest(m) for m in messages], row=row, appended=list(messages))
        state.last = ex
        if fork is not None:
            state.fork = (fork["from"], fork["position"] if fork["position"] >= 0 else None)
        self.states[(ex.deployment_id, key)] = state

    def append(self, state: _TraceState, ex: Exchange, messages: list[ParsedMessage]) -> None:
        state.appended.extend(messages)
        state.digests.extend(parsed_digest(m) for m in messages)
        state.last = ex

    def place(
        self,
        ex: Exchange,
        root: str,
        messages: list[ParsedMessage],
        *,
        known_new: bool = False,
        root_fork: dict[str, Any] | None = None,
    ) -> str:
        """Put one history (request messages + one answer) into its trace; returns the trace key.
        `root_fork` links the root, when this creates it, as a fork of another trace."""
        dep = ex.deployment_id
        if known_new and (dep, root) not in self.states:
            self.create(ex, root, messages, root_fork)
            return root
        incoming = [parsed_digest(m) for m in messages]
        compared = [d for d in incoming if d is not None]
        key, session, position = root, ex.session_id, 0
        for _ in range(MAX_FORK_DEPTH):
            self.load(dep, [key])
            state = self.states[(dep, key)]
            if state is None:
                fork = root_fork if key == root else {"from": root, "position": position, "session": session}
                self.create(ex, key, messages, fork)
                return key
            if state.obj is not None and key == root:
                session = state.obj.session_id or root
            elif state.row is not None and key == root:
                session = state.row["session_id"] or root
            stored = [d for d in state.digests if d is not None]
            position = next((i for i, (a, b) in enumerate(zip(stored, compared, strict=False)) if a != b), None)
            if position is None:
                # Only the last incoming message can be an unseen marker (a failed answer).
                extra = messages[len(stored) :] if len(compared) >= len(stored) else messages[len(compared) :]
                if extra:
                    self.append(state, ex, extra)
                return key
            key = fork_key(root, position, compared[position])
        key = new_trace_key()
        self.create(ex, key, messages, {"from": root, "position": -1, "session": session})
        return key

    def write(self) -> None:
        new = [(k, s) for k, s in self.states.items() if s is not None and s.row is not None]
        late_links: list[tuple[_TraceState, _TraceState]] = []
        for (dep, _), s in new:
            if s.fork is not None:
                parent = self.states.get((dep, s.fork[0]))
                s.row["forked_at"] = s.fork[1]
                if parent is not None and parent.id is not None:
                    s.row["forked_from_id"] = parent.id
                elif parent is not None:
                    late_links.append((s, parent))  # the parent is new in this batch too
        ids = traces_insert(
            [{**s.row, **trace_counts(s.appended), "ended_at": exchange_ended_at(s.last)} for _, s in new]
        )
        for (_, s), trace_id in zip(new, ids, strict=True):
            s.id = trace_id
        for s, parent in late_links:
            Trace.objects.filter(id=s.id).update(forked_from_id=parent.id)
        rows: list[tuple] = []
        updated: list[Trace] = []
        for s in self.states.values():
            if s is None or not s.appended:
                continue
            first = len(s.digests) - len(s.appended)
            rows.extend(
                message_row(trace_id=s.id, position=first + k, message=m, now=self.now)
                for k, m in enumerate(s.appended)
            )
            if s.obj is not None:
                t, add, ex = s.obj, trace_counts(s.appended), s.last
                t.message_count += add["message_count"]
                t.assistant_turn_count += add["assistant_turn_count"]
                t.tool_call_count += add["tool_call_count"]
                t.total_tokens += add["total_tokens"]
                t.preview = t.preview or add["preview"]
                t.updated_at = self.now
                t.status = TraceStatus.ERROR if ex.status == ExchangeStatus.ERROR else TraceStatus.OK
                t.model_version_id = ex.version_id or t.model_version_id
                t.tools = t.tools or ex.tools
                t.ended_at = max(filter(None, (t.ended_at, exchange_ended_at(ex))))
                updated.append(t)
        messages_insert(rows)
        if updated:
            _traces_update(updated)

    def remember(self) -> None:
        for key, s in self.states.items():
            if s is not None and s.id is not None:
                self.cache.put(key, s.id, s.digests)


_COUNTS = ("message_count", "assistant_turn_count", "tool_call_count", "total_tokens")
# The columns an extended trace's UPDATE writes, each with its PostgreSQL array type: one list,
# so the statement's parameters cannot drift from the values passed.
_UPDATED_TYPES = (
    ("message_count", "integer"),
    ("assistant_turn_count", "integer"),
    ("tool_call_count", "integer"),
    ("total_tokens", "integer"),
    ("preview", "text"),
    ("updated_at", "timestamptz"),
    ("status", "text"),
    ("model_version_id", "bigint"),
    ("ended_at", "timestamptz"),
    ("tools", "jsonb"),  # last: written as jsonb
)
_UPDATED = tuple(f for f, _ in _UPDATED_TYPES)


def _traces_update(traces: list[Trace]) -> None:
    """Write the counts of extended traces. On PostgreSQL one UPDATE from arrays: Django's
    `bulk_update` builds a CASE expression per field and row, which cost ~13 ms per trace in
    Python at 500 traces a batch — slower than the traffic it logs."""
    if connection.vendor != "postgresql":
        Trace.objects.bulk_update(traces, list(_UPDATED))
        return

    def tools(value: Any) -> str:
        dumped = orjson.dumps(value)
        return (orjson.dumps(strip_nul(value)) if b"\\u0000" in dumped else dumped).decode()

    traces = sorted(traces, key=lambda t: t.id)  # the same lock order in every process
    columns = [[t.id for t in traces]] + [[getattr(t, f) for t in traces] for f in _UPDATED[:-1]]
    columns.append([tools(t.tools) for t in traces])
    with connection.cursor() as cursor:
        cursor.execute(_TRACES_UPDATE_SQL, columns)


# One statement for a batch of traces, each column an array parameter.
_TRACES_UPDATE_SQL = f"""
UPDATE {Trace._meta.db_table} AS t SET {", ".join(f"{f} = v.{f}" for f in _UPDATED)}
FROM unnest(%s::bigint[], {", ".join(f"%s::{kind}[]" for _, kind in _UPDATED_TYPES)})
     AS v(id, {", ".join(_UPDATED)})
WHERE t.id = v.id
"""


def exchanges_record(*, exchanges: Sequence[Exchange], cache: TraceDigestCache | None = None) -> None:
    """Write a batch of exchanges in one transaction, in order (a later call of the same
    conversation sees the messages of an earlier one in the same batch)."""
    cache = cache if cache is not None else TraceDigestCache()
    # In the order the calls were made: a conversation's next call starts after the answer to
    # the one before, even when the two exchanges reached the writer the other way round.
    exchanges = sorted(exchanges, key=lambda e: e.started_at)
    batch = _Batch(cache, timezone.now())
    stitcher = Stitcher(batch, batch.now)
    try:
        with transaction.atomic():
            stitched = [ex for ex in exchanges if ex.stitch and not ex.explicit_trace]
            stitcher.prepare(stitched)
            # Lock every named trace, and every trace a stitched call may continue, up front,
            # in one query per deployment.
            by_dep: dict[int, list[str]] = {dep: list(keys) for dep, keys in stitcher.keys.items()}
            for ex in exchanges:
                if ex.explicit_trace:
                    by_dep.setdefault(ex.deployment_id, []).append(ex.trace_key)
            for dep, keys in by_dep.items():
                batch.load(dep, sorted(set(keys)))
            for ex in exchanges:
                turns = exchange_assistant_turns(ex)
                first = turns[0] if turns else None
                root, known_new, root_fork = ex.trace_key, not ex.explicit_trace, None
                stitching = ex.stitch and not ex.explicit_trace
                if stitching:
                    found, root_fork = stitcher.resolve(ex)
                    if found is not None:
                        root, known_new = found, False
                    elif root_fork is not None:
                        # Named by the history, so a resend of the same rewritten call finds it.
                        root = fork_key(root_fork["from"], 0, stitcher.calls[id(ex)].chain[-1])
                        known_new = False
                        batch.load(ex.deployment_id, [root_fork["from"]])  # to link the fork by id
                history = ex.messages + ([first] if first else [])
                landed = batch.place(ex, root, history, known_new=known_new, root_fork=root_fork)
                if stitching:
                    stitcher.register(ex, landed, parsed_digest(first) if first is not None else None)
                for other in turns[1:]:
                    # Another of the n choices: the client may continue with it, which is a fork.
                    landed = batch.place(ex, root, [*ex.messages, other])
                    if stitching:
                        stitcher.register(ex, landed, parsed_digest(other))
            batch.write()
            stitcher.write()
    except Exception:
        cache.clear()
        raise
    batch.remember()
