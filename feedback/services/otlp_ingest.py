"""OpenTelemetry spans into traces, one export at a time, at the cost of the spans it carries.

Each trace keeps a small state between exports (`OtelTrace`): how many messages it holds, a
digest chained over them, the last assistant turn's unanswered calls and the latest model
call taken. A model call that starts after that one extends the trace: its input is matched
against the stored messages by hashing the input alone (a tool message by its call id, the
tool span's words winning over the input's), what goes past them and its answer are
appended. A call that starts earlier (a late export, a retry whose first copy expired) is
matched against the stored messages it covers, read from the database: it may extend the
trace, never change it. A tool span answers the open call it names and is appended; a tool
span whose call no model call has made yet is held (its result parked) until one does. No
export re-reads the spans before it: a span is kept as its id alone, so a retry is taken
once, or, held, as its call id, tool name and result.

Bounds: what one span leaves stored (the messages it adds, or its parked result) is at most
`OTEL_SPAN_MAX_BYTES`, and what all spans of a trace left stored at most
`OTEL_TRACE_MAX_BYTES`; past either, that trace's spans of the export are rejected and
nothing of them is stored (the export's other traces are taken).
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from feedback.models import OtelSpan, OtelTrace, Trace, TraceSource
from feedback.services.ingest import trace_counts, traces_ingest
from feedback.services.otlp import MAX_ERROR_CHARS, MAX_SPANS, MAX_SPANS_PER_TRACE, spans_of
from feedback.services.otlp_messages import SpanReading, ns_iso, span_read
from feedback.services.otlp_trace import Rejected, TraceExtension, extension_check, state_resync
from feedback.services.trace_rows import message_row, messages_insert
from training.serving.models import Deployment
from webapp.kernel.chat_format import parse_timestamp
from webapp.kernel.nul import strip_nul

_NO_GENAI = "no GenAI or OpenInference model-call span in this trace"


@dataclass
class OtlpResult:
    traces: dict[str, int]  # created / appended / exists / held / error: how many traces
    rejected_spans: int
    error_message: str


def otlp_ingest(*, deployment: Deployment, request, now: datetime | None = None) -> OtlpResult:
    """Take the spans of a decoded export request (`otlp_decode`) for `deployment`: each trace
    they belong to is created, extended or held (see the module's docstring). Rejected, with
    the reason per trace: spans of a trace with no GenAI span, model calls without content,
    a call that contradicts the stored turns, a trace past its limits; a rejected trace's
    spans are not kept, so they do not stand in the way of the next export. Two exports of
    one trace take turns (a lock per trace)."""
    now = now or timezone.now()
    incoming: dict[str, dict[str, SpanReading]] = defaultdict(dict)
    counts = {s: 0 for s in ("created", "exists", "appended", "held", "error")}
    rejected = 0
    reasons: list[str] = []

    def reject(trace_id: str, spans: int, reason: str) -> None:
        nonlocal rejected
        counts["error"] += 1
        rejected += spans
        reasons.append(f"trace {trace_id}: {reason}")

    bad_ids = 0
    for span in spans_of(request):
        if not re.fullmatch(r"[0-9a-f]{16}", span.span_id) or span.span_id == "0" * 16:
            bad_ids += 1
            continue
        if span.span_id not in incoming[span.trace_id]:
            incoming[span.trace_id][span.span_id] = span_read(span)
    if bad_ids:
        rejected += bad_ids
        reasons.append(f"{bad_ids} span(s): spanId must be 8 bytes, not all zero")

    with transaction.atomic():
        valid = []
        for trace_id in sorted(incoming):
            if not re.fullmatch(r"[0-9a-f]{32}", trace_id) or trace_id == "0" * 32:
                reject(trace_id or "(none)", len(incoming[trace_id]), "traceId: must be 16 bytes, not all zero")
            else:
                valid.append(trace_id)
        _traces_lock(deployment.pk, valid)
        states = {s.external_id: s for s in OtelTrace.objects.filter(deployment=deployment, external_id__in=valid)}
        # Spans are kept only beside their trace's state and expire no later than it, so a
        # trace without one (every trace of a fresh run) has no span to look up.
        seen = _spans_seen(deployment, [(t, s) for t in valid if t in states for s in incoming[t]])
        traces = {
            t["external_id"]: t
            for t in Trace.objects.select_for_update()
            .filter(deployment=deployment, external_id__in=valid)
            .order_by("id")
            .values("id", "external_id", "message_count", "metadata", "ended_at", "session_id", "status")
        }
        works: list[TraceExtension] = []
        for trace_id in valid:
            got = incoming[trace_id]
            new = [r for r in got.values() if (trace_id, r.span_id) not in seen]  # a retry adds nothing
            state = states.get(trace_id) or OtelTrace(deployment=deployment, external_id=trace_id, summary={})
            trace = traces.get(trace_id)
            if state.pk is None and trace is None and not any(r.kind for r in new):
                reject(trace_id, len(got), _NO_GENAI)
                continue
            if state.spans + len(new) > MAX_SPANS_PER_TRACE:
                reject(trace_id, len(new), f"more than {MAX_SPANS_PER_TRACE} spans in one trace")
                continue
            work = TraceExtension(deployment, trace_id, state, trace, new)
            if trace is not None and (
                state.pk is None or state.messages != trace["message_count"] or (state.messages and not state.chain)
            ):
                state_resync(work)
            try:
                work.extend()
                extension_check(work)
            except Rejected as exc:
                reject(trace_id, len(got), str(exc))
                continue
            works.append(work)
            if work.notes:
                reasons.append(f"trace {trace_id}: " + "; ".join(work.notes[:3]))
        _write(deployment, works, now, counts, reject)
    _spans_expire(now)
    return OtlpResult(traces=counts, rejected_spans=rejected, error_message="; ".join(reasons)[:MAX_ERROR_CHARS])


def _spans_seen(deployment: Deployment, pairs: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which (trace id, span id) pairs are stored already: a lookup per pair in the unique
    index, so its cost follows the export, not the spans kept (a day's worth by default; two
    lists of ids made PostgreSQL scan the whole table)."""
    if not pairs:
        return set()
    if connection.vendor != "postgresql":
        traces, spans = {t for t, _ in pairs}, {s for _, s in pairs}
        found = OtelSpan.objects.filter(deployment=deployment, trace_id__in=traces, span_id__in=spans)
        return set(found.values_list("trace_id", "span_id")) & set(pairs)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT u.t, u.s FROM unnest(%s::text[], %s::text[]) AS u(t, s) WHERE EXISTS (SELECT 1 FROM "
            f"{OtelSpan._meta.db_table} o WHERE o.deployment_id = %s AND o.trace_id = u.t AND o.span_id = u.s)",
            [[t for t, _ in pairs], [s for _, s in pairs], deployment.pk],
        )
        return set(cursor.fetchall())


def _metadata(work: TraceExtension, before: dict[str, Any]) -> dict[str, Any]:
    s = work.state.summary
    otel = {**(before.get("otel") if isinstance(before.get("otel"), dict) else {}), "spans": work.state.spans}
    if s.get("service"):
        otel["service_name"] = s["service"]
    metadata = {**before, "otel": otel, **s.get("metadata", {})}
    if s.get("agent"):
        metadata.setdefault("agent", s["agent"])
    return metadata


def _write(deployment: Deployment, works: list[TraceExtension], now: datetime, counts: dict[str, int], reject) -> None:
    for work in works:
        work.state.spans += len(work.spans)
    creating = [w for w in works if w.trace is None and w.appended]
    items = []
    for w in creating:
        s = w.state.summary
        items.append(
            {
                "external_id": w.external_id,
                "messages": w.appended,
                "metadata": _metadata(w, {}),
                "session_id": s.get("session", ""),
                "model": s.get("model", ""),
                "status": "error" if s.get("error") else "ok",
                "started_at": ns_iso(s.get("started_ns") or 0),
                "ended_at": ns_iso(s.get("ended_ns") or 0),
                **({"tools": s["tools"]} if s.get("tools") else {}),
            }
        )
    dropped: set[int] = set()
    for w, result in zip(
        creating, traces_ingest(deployment=deployment, items=items, source=TraceSource.OTEL), strict=True
    ):
        if result.status == "error":
            reject(w.external_id, len(w.spans), "; ".join(f"{e['field']}: {e['reason']}" for e in result.errors))
            dropped.add(id(w))
            continue
        counts[result.status] += 1
        w.state.trace_id = result.trace_id
        w.state.messages = w.length if result.status == "created" else 0  # else read again next time
        if result.status != "created":
            w.state.chain = ""
    rows = []
    for w in works:
        if w.trace is None:
            if not w.appended:
                counts["held"] += 1
            continue
        rows += [
            message_row(trace_id=w.trace["id"], position=w.state.messages + k, message=m, now=now)
            for k, m in enumerate(w.parsed)
        ]
        _trace_update(w, now)
        counts["appended" if w.appended else "exists"] += 1
        w.state.trace_id = w.trace["id"]
        w.state.messages += len(w.appended)
    messages_insert(rows)
    kept = [w for w in works if id(w) not in dropped]
    for w in kept:
        if w.state.trace_id is not None:  # they are the trace's now: the state carries no copy
            w.state.summary.pop("metadata", None)
            if w.state.summary.pop("tools", None):
                w.state.summary["tools_stored"] = True
        w.state.held = max(0, w.state.held - len(w.taken)) + len(w.parked)
        w.state.stored_bytes += w.added_bytes
        w.state.updated_at = now
    if taken := [pk for w in kept for pk in w.taken]:
        OtelSpan.objects.filter(pk__in=taken).update(held=False, data={})
    _states_save(deployment, [w.state for w in kept])
    spans = []
    for w in kept:
        parked = {id(p) for p in w.parked}
        for r in w.spans:
            held = id(r) in parked
            data = {"call_id": r.call_id, "name": r.tool_name, "result": r.result} if held else {}
            spans.append((w.external_id, r.span_id, r.start_ns, data, held))
    _spans_save(deployment, spans, now)


_STATE_FIELDS = (
    "trace_id",
    "spans",
    "messages",
    "chain",
    "open_calls",
    "frontier_start_ns",
    "frontier_end_ns",
    "held",
    "stored_bytes",
    "summary",
    "updated_at",
)


def _states_save(deployment: Deployment, states: list[OtelTrace]) -> None:
    """Every state in one statement (an export may carry hundreds of traces)."""
    if not states:
        return
    if connection.vendor != "postgresql":
        for state in states:
            state.save()
        return
    rows = [{f: getattr(st, f) for f in _STATE_FIELDS} | {"external_id": st.external_id} for st in states]
    for row in rows:
        row["open_calls"], row["summary"] = strip_nul(row["open_calls"]), strip_nul(row["summary"])
    types = ("bigint", "int", "int", "text", "jsonb", "bigint", "bigint", "int", "bigint", "jsonb", "timestamptz")
    names = ", ".join(_STATE_FIELDS)
    # The rows as one JSON parameter: serialised in C, where arrays would be in Python.
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {OtelTrace._meta.db_table} (deployment_id, external_id, {names}) "
            f"SELECT %s, external_id, {names} FROM jsonb_to_recordset(%s::jsonb) AS u(external_id text, "
            + ", ".join(f"{f} {t}" for f, t in zip(_STATE_FIELDS, types, strict=True))
            + ") ON CONFLICT (deployment_id, external_id) DO UPDATE SET "
            + ", ".join(f"{f} = EXCLUDED.{f}" for f in _STATE_FIELDS),
            [deployment.pk, orjson.dumps(rows, default=str).decode()],
        )


def _spans_save(deployment: Deployment, spans: list[tuple[str, str, int, dict, bool]], now: datetime) -> None:
    """The export's spans, once each (a retry's are there already), in one statement."""
    if not spans:
        return
    if connection.vendor != "postgresql":
        OtelSpan.objects.bulk_create(
            [
                OtelSpan(deployment=deployment, trace_id=t, span_id=s, start_ns=n, data=d, held=h, received_at=now)
                for t, s, n, d, h in spans
            ],
            ignore_conflicts=True,
        )
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {OtelSpan._meta.db_table} "
            "(deployment_id, trace_id, span_id, start_ns, data, held, received_at) "
            "SELECT %s, u->>0, u->>1, (u->>2)::bigint, u->3, (u->>4)::bool, %s FROM jsonb_array_elements(%s::jsonb) u "
            "ON CONFLICT DO NOTHING",
            [deployment.pk, now, orjson.dumps(spans).decode()],
        )


def _trace_update(work: TraceExtension, now: datetime) -> None:
    """The stored trace with the appended turns counted and what the new spans tell about the
    whole run: its session, its end, an error, the agent's name, the model."""
    t, s = work.trace, work.state.summary
    counts = trace_counts(work.parsed)
    ended = parse_timestamp(ns_iso(s.get("ended_ns") or 0), "ended_at")
    fields: dict[str, Any] = {
        "message_count": work.state.messages + len(work.parsed),
        "assistant_turn_count": F("assistant_turn_count") + counts["assistant_turn_count"],
        "tool_call_count": F("tool_call_count") + counts["tool_call_count"],
        "total_tokens": F("total_tokens") + counts["total_tokens"],
        "metadata": strip_nul(_metadata(work, t["metadata"] if isinstance(t["metadata"], dict) else {})),
        "ended_at": max(filter(None, (t["ended_at"], ended)), default=None),
        "updated_at": now,
    }
    if s.get("error"):
        fields["status"] = "error"
    if s.get("session") and not t["session_id"]:
        fields["session_id"] = s["session"]
    if s.get("model"):
        fields["model_name"] = s["model"]
    if s.get("tools"):  # a trace that has none takes the first a model call names
        Trace.objects.filter(pk=t["id"], tools=[]).update(tools=s["tools"])
    if counts["preview"]:
        Trace.objects.filter(pk=t["id"], preview="").update(preview=counts["preview"])
    Trace.objects.filter(pk=t["id"]).update(**fields)


_EXPIRY_EVERY = timedelta(seconds=1)
_expired_at: datetime | None = None


def _spans_expire(now: datetime) -> None:
    """Spans and trace states kept past `OTEL_SPAN_RETENTION_SECONDS` go, at most once a
    second per process and in bounded steps, so one export never waits long, but faster
    than exports can add them (40,000 rows a second)."""
    global _expired_at
    if _expired_at is not None and abs(now - _expired_at) < _EXPIRY_EVERY:
        return
    _expired_at = now
    cutoff = now - timedelta(seconds=settings.OTEL_SPAN_RETENTION_SECONDS)
    for model, column in ((OtelSpan, "received_at"), (OtelTrace, "updated_at")):
        for _ in range(2 * MAX_SPANS // 5000):
            ids = list(
                model.objects.filter(**{f"{column}__lt": cutoff}).order_by(column).values_list("pk", flat=True)[:5000]
            )
            if not ids:
                break
            model.objects.filter(pk__in=ids).delete()
        else:
            return  # spans left past this round's bound: their states wait, as the lookup assumes


def _traces_lock(deployment_id: int, trace_ids: list[str]) -> None:
    """Hold these traces' locks until the transaction ends, taken in one order by every
    export so two never wait on each other crosswise (PostgreSQL; SQLite writes one at a time)."""
    if connection.vendor != "postgresql" or not trace_ids:
        return
    keys = sorted(
        int.from_bytes(
            hashlib.blake2b(f"otel:{deployment_id}:{t}".encode(), digest_size=8).digest(), "big", signed=True
        )
        for t in trace_ids
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_advisory_xact_lock(k)) FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(k, n)", [keys]
        )
