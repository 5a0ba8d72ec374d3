"""OpenTelemetry spans to a conversation: a span read (`span_read`) into the messages of a
model call (GenAI semantic conventions, OpenInference, or span events), its serving data, a
tool span's result and the tools it offered (the mapping is described in `otlp`)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from feedback.services.otlp import LLM_OPERATIONS, TOOL_OPERATION, SpanRecord, as_dict, as_list, jsonb_clean
from webapp.kernel.chat_format import SERVING_KEYS

_ROLES = frozenset({"system", "user", "assistant", "tool"})
_OPENINFERENCE_MESSAGE = re.compile(r"^llm\.(input|output)_messages\.(\d+)\.message\.(.+)$")
_OPENINFERENCE_CALL = re.compile(r"^tool_calls\.(\d+)\.tool_call\.(.+)$")
_OPENINFERENCE_TOOL = re.compile(r"^llm\.tools\.(\d+)\.tool\.json_schema$")
_MAX_INDEX = 10_000  # flattened message and call indices past this are not a conversation


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
            # orjson reads what the batch API reads; what it refuses (NaN, an infinity, a lone
            # surrogate) the slower reader takes with the same rules.
            loaded = orjson.loads(value)
        except orjson.JSONDecodeError:
            try:
                loaded = json.loads(value, parse_constant=_no_constant, parse_float=_finite, parse_int=_int)
            except (ValueError, RecursionError):
                return None
        # NaN and infinities are null already; only an escaped NUL needs the walk.
        return jsonb_clean(loaded) if "\\u0000" in value else loaded
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
        for message in as_list(_json_value(a.get("gen_ai.input.messages"))):
            inputs += _from_semconv(message)
        outputs = []
        for message in as_list(_json_value(a.get("gen_ai.output.messages"))):
            outputs += _from_semconv({"role": "assistant", **as_dict(message)})
        return inputs, outputs
    if any(k.startswith(("llm.input_messages.", "llm.output_messages.")) for k in a):
        return _from_openinference(a)
    return _from_events(span)


def _parts_messages(value: Any, role: str) -> list[dict[str, Any]]:
    parts = as_list(_json_value(value))
    text = "".join(str(as_dict(p).get("content") or "") for p in parts if as_dict(p).get("type") == "text")
    return [{"role": role, "content": text}] if text else []


def _from_semconv(message: Any) -> list[dict[str, Any]]:
    """One GenAI-convention ChatMessage ({role, parts}) as OpenAI messages: its text and
    tool calls as one message, each tool_call_response part as a tool message."""
    message = as_dict(message)
    role = message.get("role")
    if role not in _ROLES:
        return []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for part in as_list(message.get("parts")):
        part = as_dict(part)
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
            calls = as_list(_json_value(attrs.get("tool_calls")))
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
            calls = as_list(body.get("tool_calls") if body else _json_value(attrs.get("tool_calls")))
            turn: dict[str, Any] = {"role": "assistant", "content": _text(body.get("content", attrs.get("content")))}
            if calls:
                turn["tool_calls"] = [_event_call(c, i) for i, c in enumerate(calls)]
                turn["content"] = turn["content"] or None
            if isinstance(attrs.get("finish_reason"), str):
                turn["finish_reason"] = attrs["finish_reason"]
            outputs.append(turn)
    return (inputs, outputs) if inputs or outputs else None


def _event_call(call: Any, index: int) -> dict[str, Any]:
    call = as_dict(call)
    function = as_dict(call.get("function"))
    return _call(call.get("id"), function.get("name", call.get("name")), function.get("arguments"), index)


def _tool_definitions(span: SpanRecord) -> list[dict[str, Any]]:
    a = span.attributes
    tools = []
    for tool in as_list(_json_value(a.get("gen_ai.tool.definitions"))):
        tool = as_dict(tool)
        function = as_dict(tool.get("function")) or tool  # OpenAI's shape or the convention's flat one
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
        function = as_dict(schema.get("function")) or schema
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
