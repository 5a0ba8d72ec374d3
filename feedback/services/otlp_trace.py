"""One trace's part of an OTLP export: its new spans matched against what the trace holds,
through its state (`OtelTrace`), without reading the spans before them (see
feedback/services/otlp_ingest.py for the whole export)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from django.conf import settings

from feedback.models import Message, OtelSpan, OtelTrace
from feedback.services.otlp_messages import SpanReading, plain_message
from training.serving.models import Deployment
from webapp.kernel.chat_format import MAX_JSON_DEPTH, FieldError, ParsedMessage, json_depth, parse_message

NO_CONTENT = (
    "the model-call spans carry no message content; turn content capture on "
    "(OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true)"
)
UNTAKEN = (
    "the result of call {call_id} differs from the tool message stored from a later call's input; the stored one stays"
)
REWRITE = "differs from the stored message at this position; a stored trace can only be extended, not rewritten"


_ABSENT = object()


class Rejected(Exception):
    """This trace's spans of the export are refused, with the reason; the others go on."""


def message_key(message: dict[str, Any]) -> bytes:
    """What two messages must share to be the same turn: a tool message its call id (the
    tool span's words are the stored ones), any other its content without serving data."""
    if message.get("role") == "tool":
        return b"tool\x00" + str(message.get("tool_call_id") or "").encode()
    try:
        return orjson.dumps(plain_message(message), option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an integer past 64 bits: compared as text
        return repr(sorted(plain_message(message).items())).encode()


def _link(chain: str, key: bytes) -> str:
    return hashlib.blake2b(chain.encode() + key, digest_size=16).hexdigest()


def _chain(messages: list[dict[str, Any]], start: str = "") -> str:
    for m in messages:
        start = _link(start, message_key(m))
    return start


def _size(value: Any) -> int:
    return len(orjson.dumps(value, default=str))


@dataclass
class TraceExtension:
    """One trace's part of an export: its state, what the new spans add, what they park."""

    deployment: Deployment
    external_id: str
    state: OtelTrace
    trace: dict[str, Any] | None  # the stored trace's row (locked), or None
    spans: list[SpanReading]
    appended: list[dict[str, Any]] = field(default_factory=list)
    parsed: list[ParsedMessage] = field(default_factory=list)
    parked: list[SpanReading] = field(default_factory=list)  # tool spans of this export, held
    taken: set[int] = field(default_factory=set)  # held rows answered now
    notes: list[str] = field(default_factory=list)
    added_bytes: int = 0
    _held_rows: list[tuple[int, str, str]] | None = None
    _stored_keys: list[bytes] | None = None

    @property
    def length(self) -> int:
        return self.state.messages + len(self.appended)

    # --- matching against what the trace holds --------------------------------------------

    def _keys(self, n: int) -> list[bytes]:
        """The keys of the trace's first `n` messages: the stored ones read from the database
        (only as far as asked), then those this export appended."""
        stored = min(n, self.state.messages)
        if stored and (self._stored_keys is None or len(self._stored_keys) < stored):
            raws = Message.objects.filter(trace_id=self.trace["id"], position__lt=stored).order_by("position")
            self._stored_keys = [message_key(r) for r in raws.values_list("raw", flat=True)]
        return (self._stored_keys or [])[:stored] + [message_key(m) for m in self.appended[: n - stored]]

    def _matched(self, messages: list[dict[str, Any]]) -> int:
        """How many of `messages`, from the first, are the trace's own messages."""
        total = self.length
        if len(messages) >= total and _chain(messages[:total]) == self.state.chain:
            return total
        n = min(len(messages), total)
        keys = self._keys(n)
        common = 0
        while common < n and keys[common] == message_key(messages[common]):
            common += 1
        return common

    # --- held tool results ----------------------------------------------------------------

    def _held(self) -> list[tuple[int, str, str]]:
        if self._held_rows is None:
            self._held_rows = []
            if self.state.held:
                self._held_rows = list(
                    OtelSpan.objects.filter(deployment=self.deployment, trace_id=self.external_id, held=True)
                    .order_by("start_ns", "id")
                    .values_list("pk", "data__call_id", "data__name")
                )
        return self._held_rows

    def _take(self, call_id: str, name: str | None) -> str | None:
        """The held result for this call (by id, else by its tool's name when `name` is given),
        which the call now answers."""
        for by_name in (False, True) if name is not None else (False,):
            for pk, cid, tool in self._held():
                if pk not in self.taken and ((tool == name and not cid) if by_name else cid == call_id):
                    self.taken.add(pk)
                    text = OtelSpan.objects.filter(pk=pk).values_list("data__result", flat=True).first() or ""
                    self.added_bytes -= len(text.encode())  # counted when it was parked
                    return text
            for r in self.parked:
                if (r.tool_name == name and not r.call_id) if by_name else r.call_id == call_id:
                    self.parked.remove(r)
                    self.added_bytes -= len(r.result.encode())  # counted again as its message
                    return r.result
        return None

    # --- appending ------------------------------------------------------------------------

    def _push(self, message: dict[str, Any]) -> None:
        self.appended.append(message)
        self.state.chain = _link(self.state.chain, message_key(message))
        self.added_bytes += _size(message)

    def _flush(self, *, closing: bool) -> None:
        """The open calls' held results, after the turn's tool messages; a closing turn
        (a message other than a tool's follows) leaves none open."""
        still = []
        for call_id, name in self.state.open_calls:
            text = self._take(call_id, name)
            if text is not None:
                self._push({"role": "tool", "tool_call_id": call_id, "content": text})
            else:
                still.append([call_id, name])
        self.state.open_calls = [] if closing else still

    def _append(self, messages: list[dict[str, Any]]) -> None:
        for m in messages:
            if m.get("role") != "tool":
                self._flush(closing=True)
            else:
                call_id = m.get("tool_call_id")
                text = self._take(call_id, None)
                m = {**m, "content": text} if text is not None else m
                self.state.open_calls = [c for c in self.state.open_calls if c[0] != call_id]
            self._push(m)
            if m.get("role") == "assistant":
                self.state.open_calls = _calls(m)
        self._flush(closing=False)

    # --- the spans ------------------------------------------------------------------------

    def extend(self) -> None:
        """Take this export's new spans, in start order."""
        for r in sorted(self.spans, key=lambda r: r.key):
            before = self.added_bytes
            self._summarise(r)
            if r.kind == "llm":
                self._model_call(r)
            elif r.kind == "tool":
                self._tool(r)
            if self.added_bytes - before > settings.OTEL_SPAN_MAX_BYTES:
                raise Rejected(
                    f"span {r.span_id} would store {self.added_bytes - before} bytes; "
                    f"at most {settings.OTEL_SPAN_MAX_BYTES} per span (PRACTICUM_OTEL_SPAN_MAX_BYTES)"
                )

    def _model_call(self, r: SpanReading) -> None:
        if r.inputs is None and not r.outputs:
            self.notes.append(f"span {r.span_id}: no message content")
            return
        inputs = r.inputs or []
        if r.key >= (self.state.frontier_start_ns, self.state.frontier_end_ns):
            # The run goes on: what its input says past the trace, then its answer.
            self._append(inputs[self._matched(inputs) :] + r.outputs)
            self.state.frontier_start_ns, self.state.frontier_end_ns = r.key
            s = self.state.summary
            s["model"] = r.model or s.get("model", "")
            if r.tools and not s.get("tools") and not s.get("tools_stored"):
                # The trace keeps the first definitions a call names (`Trace.tools`), once.
                s["tools"] = r.tools
                self.added_bytes += _size(r.tools)
            return
        # A call from before the latest one: it may say only what the trace holds, then more.
        said = inputs + r.outputs
        common = self._matched(said)
        if common < min(len(said), self.length):
            raise Rejected(f"span {r.span_id}: messages[{common}] {REWRITE}")
        self._append(said[self.length :])

    def _tool(self, r: SpanReading) -> None:
        if r.result is None:
            return
        open_calls = self.state.open_calls
        match = next(
            (c for c in open_calls if (c[0] == r.call_id if r.call_id else c[1] == r.tool_name)),
            None,
        )
        if match is not None:
            self.state.open_calls = [c for c in open_calls if c is not match]
            self._push({"role": "tool", "tool_call_id": match[0], "content": r.result})
            return
        if r.call_id and self.trace is not None:
            answered = [
                m["content"] for m in self.appended if m.get("role") == "tool" and m.get("tool_call_id") == r.call_id
            ]
            answered += Message.objects.filter(
                trace_id=self.trace["id"], role="tool", tool_call_id=r.call_id
            ).values_list("content", flat=True)[:1]
            if answered:
                if answered[0] != r.result:
                    # The next call's input, exported first, gave its words: they are stored and
                    # stay (a stored turn is never rewritten), and the run's other spans go on.
                    self.notes.append(f"span {r.span_id}: {UNTAKEN.format(call_id=r.call_id)}")
                return
        self.parked.append(r)  # its call is still to come
        self.added_bytes += len(r.result.encode())

    def _summarise(self, r: SpanReading) -> None:
        s = self.state.summary
        if r.start_ns > 0:
            s["started_ns"] = min(s.get("started_ns") or r.start_ns, r.start_ns)
        s["ended_ns"] = max(s.get("ended_ns") or 0, r.end_ns, r.start_ns)
        s["error"] = bool(s.get("error")) or r.error
        for key, value in (("session", r.session), ("agent", r.agent), ("service", r.service)):
            if value and not s.get(key):
                s[key] = value
        if r.metadata:
            if json_depth(r.metadata) > MAX_JSON_DEPTH:  # as every other way in refuses it
                raise Rejected(f"span {r.span_id}: metadata: nested more than {MAX_JSON_DEPTH} levels deep")
            held = s.get("metadata", {})
            stored = self.trace["metadata"] if self.trace and isinstance(self.trace["metadata"], dict) else {}
            # Only what changes the trace's metadata is stored: a run's every span may repeat it.
            changed = {k: v for k, v in r.metadata.items() if (held[k] if k in held else stored.get(k, _ABSENT)) != v}
            if changed:
                s["metadata"] = {**held, **changed}
                self.added_bytes += _size(changed)


def _calls(message: dict[str, Any]) -> list[list[str]]:
    return [
        [str(c.get("id") or ""), str((c.get("function") or {}).get("name") or "")]
        for c in message.get("tool_calls") or []
        if isinstance(c, dict)
    ]


def state_resync(work: TraceExtension) -> None:
    """The state read again from the stored messages: there was none (it expired, or the
    trace came another way), or the trace changed beside it. Costs the trace's length, once."""
    raws = list(Message.objects.filter(trace_id=work.trace["id"]).order_by("position").values_list("raw", flat=True))
    state = work.state
    state.messages, state.chain, state.open_calls = len(raws), _chain(raws), []
    for raw in raws:
        if raw.get("role") == "assistant":
            state.open_calls = _calls(raw)
        elif raw.get("role") == "tool":
            state.open_calls = [c for c in state.open_calls if c[0] != raw.get("tool_call_id")]
        else:
            state.open_calls = []
    state.stored_bytes = max(state.stored_bytes, sum(_size(r) for r in raws))
    if state.frontier_start_ns < 0 and work.trace["ended_at"] is not None:
        # A model call from before the trace's end is matched against what it holds.
        ended = int(work.trace["ended_at"].timestamp() * 1e9)
        state.frontier_start_ns, state.frontier_end_ns = ended, ended
    work._stored_keys = [message_key(r) for r in raws]


def extension_check(work: TraceExtension) -> None:
    """The trace's limits, and what a trace that is not stored yet needs to become one."""
    state = work.state
    if work.length > settings.INGEST_MAX_MESSAGES_PER_TRACE:
        raise Rejected(f"messages: {work.length} messages; at most {settings.INGEST_MAX_MESSAGES_PER_TRACE} per trace")
    if state.stored_bytes + work.added_bytes > settings.OTEL_TRACE_MAX_BYTES:
        raise Rejected(
            f"its spans would store {state.stored_bytes + work.added_bytes} bytes; at most "
            f"{settings.OTEL_TRACE_MAX_BYTES} per trace (PRACTICUM_OTEL_TRACE_MAX_BYTES)"
        )
    if work.trace is None and not work.appended:
        if any(r.kind == "llm" for r in work.spans):
            raise Rejected(NO_CONTENT)
        return  # tool spans before their model call: held
    if work.trace is not None:
        for k, m in enumerate(work.appended):
            try:
                work.parsed.append(parse_message(m, f"messages[{state.messages + k}]"))
            except FieldError as exc:
                raise Rejected(f"{exc.field}: {exc.reason}") from None
