"""OpenTelemetry traces in: OTLP/HTTP trace exports (protobuf or JSON, gzip or not) become
Practicum traces, so an agent that is already instrumented needs no other change than where
its exporter sends.

One OpenTelemetry trace is one Practicum trace, and its external id is the 32-hex trace id:
the id the agent's own span context holds, so feedback can name the run by it. Within a
trace, spans that follow the OpenTelemetry GenAI semantic conventions
(`gen_ai.operation.name` = chat / text_completion / generate_content, messages in
`gen_ai.input.messages`, `gen_ai.output.messages` and `gen_ai.system_instructions`) or the
OpenInference conventions (`openinference.span.kind` = LLM, `llm.input_messages.N.message.*`,
`llm.output_messages.N.message.*`) are its model calls, in start order: each call's input
extends the conversation where it goes past what the trace already holds, and its output is
the next assistant turn, with the span's model, tokens, finish reason and latency. Tool spans
(`execute_tool`, or OpenInference TOOL) add their result after the call that asked for it
when no later model call's input carried it. Other spans (the agent's own, HTTP, database)
add only the trace's times, status and session.

The payload is parsed with the official `opentelemetry-proto` messages, and each span is read
(`span_read`) into what the mapping needs, nothing more; `feedback/services/otlp_ingest.py`
takes the readings into traces, one export at a time. A new trace goes through batch ingest
(`traces_ingest`) like any other source, and every appended turn through the same message
validation and limits and the append-only rule, so spans of one run may arrive over several
exports as long as each model call carries its input (the instrumentations do once message
content capture is on: `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from feedback.services.chat_format import SERVING_KEYS

MAX_SPANS = 20_000  # per export request
MAX_SPANS_PER_TRACE = 5_000
MAX_ERROR_CHARS = 2_000
LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
TOOL_OPERATION = "execute_tool"
_ROLES = frozenset({"system", "user", "assistant", "tool"})
_OPENINFERENCE_MESSAGE = re.compile(r"^llm\.(input|output)_messages\.(\d+)\.message\.(.+)$")
_OPENINFERENCE_CALL = re.compile(r"^tool_calls\.(\d+)\.tool_call\.(.+)$")
_OPENINFERENCE_TOOL = re.compile(r"^llm\.tools\.(\d+)\.tool\.json_schema$")
_MAX_INDEX = 10_000  # flattened message and call indices past this are not a conversation


class OtlpError(ValueError):
    """An export request that cannot be read at all (a 400), with the field and reason."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


@dataclass
class SpanRecord:
    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start_ns: int
    end_ns: int
    error: bool
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any]

    @property
    def operation(self) -> str:
        op = self.attributes.get("gen_ai.operation.name")
        if isinstance(op, str) and op:
            return op
        kind = str(self.attributes.get("openinference.span.kind") or "").upper()
        return {"LLM": "chat", "TOOL": TOOL_OPERATION}.get(kind, "")


# --- decoding -------------------------------------------------------------------------------


def otlp_decode(body: bytes, *, content_type: str, content_encoding: str, max_bytes: int):
    """The export request in `body` (an `ExportTraceServiceRequest`) and whether it came as
    JSON. Raises `OtlpError` for a body that is not one; a gzip body may unpack to at most
    `max_bytes`."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    encoding = (content_encoding or "").strip().lower()
    if encoding == "gzip":
        body = _gunzip(body, max_bytes)
    elif encoding not in ("", "identity"):
        raise OtlpError("Content-Encoding", f"{encoding[:40]!r} is not supported; send gzip or nothing")
    kind = (content_type or "").split(";")[0].strip().lower()
    request = ExportTraceServiceRequest()
    if kind == "application/x-protobuf":
        try:
            request.ParseFromString(body)
        except (DecodeError, RecursionError) as exc:
            raise OtlpError("body", f"not an OTLP ExportTraceServiceRequest in protobuf: {exc}") from None
        return request, False
    if kind == "application/json":
        try:
            data = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise OtlpError("body", f"not valid JSON: {str(exc)[:200]}") from None
        if not isinstance(data, dict):
            raise OtlpError("body", "must be an OTLP ExportTraceServiceRequest object")
        _hex_ids_to_base64(data)
        try:
            json_format.ParseDict(data, request, ignore_unknown_fields=True, max_recursion_depth=64)
        except (json_format.ParseError, RecursionError) as exc:
            raise OtlpError("body", f"not an OTLP ExportTraceServiceRequest: {str(exc)[:300]}") from None
        return request, True
    raise OtlpError("Content-Type", "must be application/x-protobuf or application/json")


def _gunzip(body: bytes, max_bytes: int) -> bytes:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise OtlpError("body", f"not valid gzip: {exc}") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise OtlpError("body", f"unpacks to more than {max_bytes} bytes")
    return out


def _hex_ids_to_base64(data: dict[str, Any]) -> None:
    """OTLP/JSON writes trace and span ids as hex, where protobuf's JSON mapping expects
    base64 for bytes: convert them in place before parsing."""
    for rs in _list(data.get("resourceSpans")):
        for ss in _list(_dict(rs).get("scopeSpans")):
            for span in _list(_dict(ss).get("spans")):
                span = _dict(span)
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = _hex_to_base64(span[key], key)
                for link in _list(span.get("links")):
                    link = _dict(link)
                    for key in ("traceId", "spanId"):
                        if link.get(key):
                            link[key] = _hex_to_base64(link[key], f"links.{key}")


def _hex_to_base64(value: Any, path: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except (TypeError, ValueError, binascii.Error):
        raise OtlpError(path, f"must be a hex string, got {str(value)[:40]!r}") from None


def _list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def any_value(value) -> Any:
    """An OTLP AnyValue as plain Python that PostgreSQL can store: bytes as base64 text,
    NUL in text as U+FFFD, a NaN or infinite double as null."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {_clean(kv.key): any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return _clean(getattr(value, kind))


def _clean(value: Any) -> Any:
    """Text without NUL and numbers that are finite, all the way down (span content is
    untrusted: jsonb holds neither NUL nor NaN)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {_clean(str(k)): _clean(v) for k, v in value.items()}
    return value


def spans_of(request) -> list[SpanRecord]:
    """Every span of an export request, with its resource's attributes."""
    spans = []
    for rs in request.resource_spans:
        resource = {_clean(kv.key): any_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                if len(spans) >= MAX_SPANS:
                    raise OtlpError("resourceSpans", f"more than {MAX_SPANS} spans in one request")
                spans.append(
                    SpanRecord(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        name=_clean(span.name),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        error=span.status.code == 2,  # STATUS_CODE_ERROR
                        attributes={_clean(kv.key): any_value(kv.value) for kv in span.attributes},
                        events=[
                            (_clean(e.name), {_clean(kv.key): any_value(kv.value) for kv in e.attributes})
                            for e in span.events
                        ],
                        resource=resource,
                    )
                )
    return spans


def export_response(*, rejected: int, message: str, as_json: bool) -> tuple[bytes, str]:
    """The `ExportTraceServiceResponse` body and its content type."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

    response = ExportTraceServiceResponse()
    if rejected or message:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message[:MAX_ERROR_CHARS]
    if as_json:
        return json_format.MessageToJson(response, indent=None).encode(), "application/json"
    return response.SerializeToString(), "application/x-protobuf"


# --- spans to a conversation --------------------------------------------------------------


def plain_message(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k not in SERVING_KEYS}


def ns_iso(ns: int) -> str | None:
    if ns <= 0:
        return None
    try:
        return datetime.fromtimestamp(ns / 1e9, tz=UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        return None


def _json_value(value: Any) -> Any:
    """An attribute that holds JSON: as a string (most instrumentations) or already structured."""
    if isinstance(value, str):
        try:
            loaded = json.loads(value, parse_constant=_no_constant, parse_float=_finite, parse_int=_int)
        except (ValueError, RecursionError):
            return None
        # NaN and infinities are null already; only an escaped NUL needs the walk.
        return _clean(loaded) if "\\u0000" in value else loaded
    return value


def _no_constant(_: str) -> None:
    return None


def _int(text: str) -> int | float | None:
    """An integer as the batch API reads it (orjson): past 64 bits, a float."""
    number = int(text)
    return number if -(2**63) <= number < 2**64 else _finite(text)


def _finite(text: str) -> float | None:
    number = float(text)
    return number if math.isfinite(number) else None


def _json_object(value: Any) -> dict[str, Any]:
    value = _json_value(value)
    return value if isinstance(value, dict) else {}


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    return json.dumps(value, ensure_ascii=False, default=str)


def _arguments(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value if value is not None else {}, ensure_ascii=False)


def _model(span: SpanRecord) -> str:
    for key in ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name"):
        value = span.attributes.get(key)
        if isinstance(value, str) and value:
            return value
    return ""


def _with_serving(message: dict[str, Any], span: SpanRecord) -> dict[str, Any]:
    """The span's serving data on the assistant turn it produced."""
    if message.get("role") != "assistant":
        return message
    a = span.attributes
    out = dict(message)
    if span.end_ns > span.start_ns > 0:
        out["latency_ms"] = round((span.end_ns - span.start_ns) / 1e6, 3)
    prompt = a.get("gen_ai.usage.input_tokens", a.get("llm.token_count.prompt"))
    completion = a.get("gen_ai.usage.output_tokens", a.get("llm.token_count.completion"))
    usage = {
        k: v
        for k, v in (("prompt_tokens", prompt), ("completion_tokens", completion))
        if isinstance(v, int) and not isinstance(v, bool)
    }
    if len(usage) == 2:
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    if usage:
        out["usage"] = usage
    reasons = a.get("gen_ai.response.finish_reasons")
    if "finish_reason" not in out and isinstance(reasons, list) and reasons and isinstance(reasons[0], str):
        out["finish_reason"] = reasons[0]
    if isinstance(a.get("gen_ai.response.id"), str):
        out["response_id"] = a["gen_ai.response.id"]
    return out


def _llm_messages(span: SpanRecord) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """A model call's (input, output) messages in the OpenAI chat format, from whichever
    convention the span follows; None when it carries no content."""
    a = span.attributes
    if "gen_ai.input.messages" in a or "gen_ai.output.messages" in a:
        inputs = _parts_messages(a.get("gen_ai.system_instructions"), "system")
        for message in _list(_json_value(a.get("gen_ai.input.messages"))):
            inputs += _from_semconv(message)
        outputs = []
        for message in _list(_json_value(a.get("gen_ai.output.messages"))):
            outputs += _from_semconv({"role": "assistant", **_dict(message)})
        return inputs, outputs
    if any(k.startswith(("llm.input_messages.", "llm.output_messages.")) for k in a):
        return _from_openinference(a)
    return _from_events(span)


def _parts_messages(value: Any, role: str) -> list[dict[str, Any]]:
    parts = _list(_json_value(value))
    text = "".join(str(_dict(p).get("content") or "") for p in parts if _dict(p).get("type") == "text")
    return [{"role": role, "content": text}] if text else []


def _from_semconv(message: Any) -> list[dict[str, Any]]:
    """One GenAI-convention ChatMessage ({role, parts}) as OpenAI messages: its text and
    tool calls as one message, each tool_call_response part as a tool message."""
    message = _dict(message)
    role = message.get("role")
    if role not in _ROLES:
        return []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for part in _list(message.get("parts")):
        part = _dict(part)
        kind = part.get("type")
        if kind == "text":
            texts.append(_text(part.get("content")))
        elif kind == "tool_call":
            calls.append(_call(part.get("id"), part.get("name"), part.get("arguments"), len(calls)))
        elif kind == "tool_call_response":
            results.append(
                {"role": "tool", "tool_call_id": str(part.get("id") or ""), "content": _text(part.get("response"))}
            )
    out: list[dict[str, Any]] = []
    if role == "tool" or (results and not texts and not calls):
        return [r for r in results if r["tool_call_id"]]
    if role == "assistant":
        turn: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
        if calls:
            turn["tool_calls"] = calls
        if isinstance(message.get("finish_reason"), str):
            turn["finish_reason"] = message["finish_reason"]
        out.append(turn)
    else:
        out.append({"role": role, "content": "".join(texts)})
    return out + [r for r in results if r["tool_call_id"]]


def _call(call_id: Any, name: Any, arguments: Any, index: int) -> dict[str, Any]:
    return {
        "id": str(call_id) if call_id else f"call_{index}",
        "type": "function",
        "function": {"name": str(name or ""), "arguments": _arguments(arguments)},
    }


def _from_openinference(a: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    flat: dict[str, dict[int, dict[str, Any]]] = {"input": {}, "output": {}}
    for key, value in a.items():
        m = _OPENINFERENCE_MESSAGE.match(key)
        if m and int(m.group(2)) < _MAX_INDEX:
            flat[m.group(1)].setdefault(int(m.group(2)), {})[m.group(3)] = value
    sides = []
    for side in ("input", "output"):
        messages = []
        for index in sorted(flat[side]):
            fields = flat[side][index]
            role = fields.get("role")
            role = "assistant" if side == "output" and role is None else role
            if role not in _ROLES:
                continue
            calls: dict[int, dict[str, Any]] = {}
            for key, value in fields.items():
                c = _OPENINFERENCE_CALL.match(key)
                if c and int(c.group(1)) < _MAX_INDEX:
                    calls.setdefault(int(c.group(1)), {})[c.group(2)] = value
            content = fields.get("content")
            if content is None:  # multimodal: message.contents.N.message_content.text
                texts = [v for k, v in sorted(fields.items()) if k.endswith("message_content.text")]
                content = "".join(_text(t) for t in texts) if texts else None
            message: dict[str, Any] = {"role": role}
            if role == "tool":
                message["tool_call_id"] = str(fields.get("tool_call_id") or "")
                if not message["tool_call_id"]:
                    continue
            tool_calls = [
                _call(c.get("id"), c.get("function.name"), c.get("function.arguments"), i)
                for i, c in (sorted(calls.items()) if role == "assistant" else [])
            ]
            message["content"] = _text(content) if content is not None or not tool_calls else None
            if tool_calls:
                message["tool_calls"] = tool_calls
            messages.append(message)
        sides.append(messages)
    return sides[0], sides[1]


_EVENT_ROLES = {
    "gen_ai.system.message": "system",
    "gen_ai.user.message": "user",
    "gen_ai.assistant.message": "assistant",
    "gen_ai.tool.message": "tool",
}


def _from_events(span: SpanRecord) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
    """The earlier GenAI convention: one span event per message (content, tool_calls, id)
    and `gen_ai.choice` for the output."""
    inputs: list[dict[str, Any]] = []
    outputs: list[dict[str, Any]] = []
    for name, attrs in span.events:
        if name in _EVENT_ROLES:
            role = _EVENT_ROLES[name]
            message: dict[str, Any] = {"role": role, "content": _text(attrs.get("content"))}
            calls = _list(_json_value(attrs.get("tool_calls")))
            if role == "assistant" and calls:
                message["tool_calls"] = [_event_call(c, i) for i, c in enumerate(calls)]
                message["content"] = message["content"] or None
            if role == "tool":
                message["tool_call_id"] = str(attrs.get("id") or "")
                if not message["tool_call_id"]:
                    continue
            inputs.append(message)
        elif name == "gen_ai.choice":
            body = _json_object(attrs.get("message"))
            calls = _list(body.get("tool_calls") if body else _json_value(attrs.get("tool_calls")))
            turn: dict[str, Any] = {"role": "assistant", "content": _text(body.get("content", attrs.get("content")))}
            if calls:
                turn["tool_calls"] = [_event_call(c, i) for i, c in enumerate(calls)]
                turn["content"] = turn["content"] or None
            if isinstance(attrs.get("finish_reason"), str):
                turn["finish_reason"] = attrs["finish_reason"]
            outputs.append(turn)
    return (inputs, outputs) if inputs or outputs else None


def _event_call(call: Any, index: int) -> dict[str, Any]:
    call = _dict(call)
    function = _dict(call.get("function"))
    return _call(call.get("id"), function.get("name", call.get("name")), function.get("arguments"), index)


def _tool_definitions(span: SpanRecord) -> list[dict[str, Any]]:
    a = span.attributes
    tools = []
    for tool in _list(_json_value(a.get("gen_ai.tool.definitions"))):
        tool = _dict(tool)
        function = _dict(tool.get("function")) or tool  # OpenAI's shape or the convention's flat one
        if isinstance(function.get("name"), str) and function["name"]:
            spec = {"name": function["name"]}
            if isinstance(function.get("description"), str):
                spec["description"] = function["description"]
            if isinstance(function.get("parameters"), dict):
                spec["parameters"] = function["parameters"]
            tools.append({"type": "function", "function": spec})
    if tools:
        return tools
    indexed = []
    for key, value in a.items():
        m = _OPENINFERENCE_TOOL.match(key)
        schema = _json_object(value) if m else {}
        function = _dict(schema.get("function")) or schema
        if m and isinstance(function.get("name"), str) and function["name"]:
            parameters = function.get("parameters")
            spec = {"name": function["name"], **({"parameters": parameters} if isinstance(parameters, dict) else {})}
            indexed.append((int(m.group(1)), {"type": "function", "function": spec}))
    return [t for _, t in sorted(indexed, key=lambda x: x[0])]


MAX_NS = 2**63 - 1


@dataclass
class SpanReading:
    """What the trace mapping reads of one span, and nothing else: the rest of its attributes
    (however large) is not kept past the export that carried it."""

    span_id: str
    start_ns: int
    end_ns: int
    error: bool
    kind: str  # "llm", "tool" or "" (any other span)
    inputs: list[dict[str, Any]] | None = None  # a model call's input; None when it carries no content
    outputs: list[dict[str, Any]] = field(default_factory=list)  # its answer, with the serving data
    tools: list[dict[str, Any]] = field(default_factory=list)
    model: str = ""
    call_id: str = ""  # a tool span's call, by id or else by tool name
    tool_name: str = ""
    result: str | None = None
    session: str = ""
    agent: str = ""
    service: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[int, int]:
        return (self.start_ns, self.end_ns)


def span_read(span: SpanRecord) -> SpanReading:
    """The span as the mapping reads it (see the module's docstring)."""
    a = span.attributes
    # Past the signed 64 bits the database keeps (the year 2262): read as its last instant.
    reading = SpanReading(span.span_id, min(span.start_ns, MAX_NS), min(span.end_ns, MAX_NS), span.error, "")
    operation = span.operation
    if operation in LLM_OPERATIONS:
        reading.kind = "llm"
        read = _llm_messages(span)
        if read is not None:
            reading.inputs = read[0]
            reading.outputs = [_with_serving(m, span) for m in read[1]]
        reading.tools = _tool_definitions(span)
        reading.model = _model(span)[:200]
    elif operation == TOOL_OPERATION:
        reading.kind = "tool"
        result = a.get("gen_ai.tool.call.result", a.get("output.value"))
        reading.result = None if result is None else _text(result)
        call_id = a.get("gen_ai.tool.call.id", a.get("tool_call.id"))
        reading.call_id = call_id[:200] if isinstance(call_id, str) else ""
        reading.tool_name = str(a.get("gen_ai.tool.name", a.get("tool.name")) or "")[:200]
    reading.session = next(
        (
            str(v)[:200]
            for v in (a.get("gen_ai.conversation.id"), a.get("session.id"))
            if isinstance(v, str | int) and not isinstance(v, bool) and str(v)
        ),
        "",
    )
    agent = a.get("gen_ai.agent.name")
    reading.agent = agent[:200] if isinstance(agent, str) else ""
    service = span.resource.get("service.name")
    reading.service = service[:200] if isinstance(service, str) else ""
    reading.metadata = _json_object(a.get("metadata"))  # OpenInference: a JSON object
    return reading
