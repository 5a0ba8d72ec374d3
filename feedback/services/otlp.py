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
(`otlp_messages.span_read`) into what the mapping needs, nothing more; `feedback/services/otlp_ingest.py`
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
import zlib
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

MAX_SPANS = 20_000  # per export request
MAX_SPANS_PER_TRACE = 5_000
MAX_ERROR_CHARS = 2_000
LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
TOOL_OPERATION = "execute_tool"


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
    for rs in as_list(data.get("resourceSpans")):
        for ss in as_list(as_dict(rs).get("scopeSpans")):
            for span in as_list(as_dict(ss).get("spans")):
                span = as_dict(span)
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = _hex_to_base64(span[key], key)
                for link in as_list(span.get("links")):
                    link = as_dict(link)
                    for key in ("traceId", "spanId"):
                        if link.get(key):
                            link[key] = _hex_to_base64(link[key], f"links.{key}")


def _hex_to_base64(value: Any, path: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except (TypeError, ValueError, binascii.Error):
        raise OtlpError(path, f"must be a hex string, got {str(value)[:40]!r}") from None


def as_list(value: Any) -> list:
    return value if isinstance(value, list) else []


def as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def any_value(value) -> Any:
    """An OTLP AnyValue as plain Python that PostgreSQL can store: bytes as base64 text,
    NUL in text as U+FFFD, a NaN or infinite double as null."""
    kind = value.WhichOneof("value")
    if kind == "string_value":  # nearly every attribute: spared the general walk
        text = value.string_value
        return text.replace("\x00", "\ufffd") if "\x00" in text else text
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {jsonb_clean(kv.key): any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    return jsonb_clean(getattr(value, kind))


def jsonb_clean(value: Any) -> Any:
    """Text without NUL and numbers that are finite, all the way down (span content is
    untrusted: jsonb holds neither NUL nor NaN)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [jsonb_clean(v) for v in value]
    if isinstance(value, dict):
        return {jsonb_clean(str(k)): jsonb_clean(v) for k, v in value.items()}
    return value


def spans_of(request) -> list[SpanRecord]:
    """Every span of an export request, with its resource's attributes."""
    spans = []
    for rs in request.resource_spans:
        resource = {jsonb_clean(kv.key): any_value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                if len(spans) >= MAX_SPANS:
                    raise OtlpError("resourceSpans", f"more than {MAX_SPANS} spans in one request")
                spans.append(
                    SpanRecord(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        name=jsonb_clean(span.name),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        error=span.status.code == 2,  # STATUS_CODE_ERROR
                        attributes={jsonb_clean(kv.key): any_value(kv.value) for kv in span.attributes},
                        events=[
                            (jsonb_clean(e.name), {jsonb_clean(kv.key): any_value(kv.value) for kv in e.attributes})
                            for e in span.events
                        ],
                        resource=resource,
                    )
                )
    return spans


def export_response(*, rejected: int, message: str, as_json: bool) -> tuple[bytes, str]:
    """The `ExportTraceServiceResponse` body and its content type."""
    response = ExportTraceServiceResponse()
    if rejected or message:
        response.partial_success.rejected_spans = rejected
        response.partial_success.error_message = message[:MAX_ERROR_CHARS]
    if as_json:
        return json_format.MessageToJson(response, indent=None).encode(), "application/json"
    return response.SerializeToString(), "application/x-protobuf"
