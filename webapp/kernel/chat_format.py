"""Validation of OpenAI chat-format messages and tool definitions.

Pure functions: each returns a normalised value or raises `FieldError` naming the field
(relative to the item being validated) and the reason, so a batch can report exactly
what was wrong with one item and keep the others.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from django.utils.dateparse import parse_datetime

from webapp.kernel.errors import Invalid

ROLES = frozenset({"system", "user", "assistant", "tool"})
SERVING_KEYS = ("token_ids", "token_logprobs", "latency_ms", "finish_reason", "usage", "response_id")
# The deepest nesting of JSON (objects and arrays inside one another) a trace may carry, in
# its messages, tool definitions, metadata and tool-call arguments. Real data stays far below;
# a few thousand levels (6 kB) break every recursive reader (Python's json, the templates,
# JSON Schema validation) and orjson writes no more than 254.
MAX_JSON_DEPTH = 64


class FieldError(Invalid, ValueError):
    """One field of the input is invalid (400, naming the field and the reason)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason, field=field)
        self.args = (f"{field}: {reason}",)

    def as_dict(self) -> dict[str, str]:
        return {"field": self.field, "reason": self.reason}


@dataclass(slots=True)
class ParsedMessage:
    role: str
    content: str
    content_parts: list[dict[str, Any]] | None
    name: str
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str
    raw: dict[str, Any]
    serving: dict[str, Any] = field(default_factory=dict)
    digest: str | None = None  # what it says, hashed (`message_digests.parsed_digest` fills it once)


def json_depth(value: Any, *, stop_after: int = MAX_JSON_DEPTH) -> int:
    """How deeply objects and arrays nest in `value` (a scalar is 0, `[]` is 1), counted
    without recursion; counting stops once past `stop_after`."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > stop_after:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list | tuple))
    return deepest


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def json_text_depth(text: str) -> int:
    """How deeply arrays and objects nest in a JSON text (valid or not), without parsing it."""
    if text.count("[") + text.count("{") <= 1:
        return min(1, text.count("[") + text.count("{"))
    depth = deepest = 0
    for match in _BRACKET.finditer(_JSON_STRING.sub("", text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif depth:
            depth -= 1
    return deepest


def json_depth_check(value: Any, path: str, *, limit: int = MAX_JSON_DEPTH) -> None:
    """Raise `FieldError(path, …)` when `value` (or, for a string, the JSON text it holds)
    nests deeper than `limit`. Every way traces come in (the batch API, JSONL import, the
    gateway) checks here, so nothing deeper is ever stored."""
    depth = json_text_depth(value) if isinstance(value, str) else json_depth(value, stop_after=limit)
    if depth > limit:
        raise FieldError(path, f"nested more than {limit} levels deep")


def json_loads_bounded(text: str, *, limit: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads` for untrusted text: a text nested deeper than `limit` raises
    ValueError like any other unreadable JSON, instead of RecursionError."""
    if json_text_depth(text) > limit:
        raise ValueError(f"nested more than {limit} levels deep")
    return json.loads(text)


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _content(value: Any, path: str) -> tuple[str, list[dict[str, Any]] | None]:
    if isinstance(value, str):
        return value, None
    if isinstance(value, list):
        texts = []
        for i, part in enumerate(value):
            if not isinstance(part, dict):
                raise FieldError(f"{path}[{i}]", f"must be an object, got {_type_name(part)}")
            kind = part.get("type")
            if not isinstance(kind, str):
                raise FieldError(f"{path}[{i}].type", "required string")
            if kind == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise FieldError(f"{path}[{i}].text", "a text part needs a string 'text'")
                texts.append(text)
        return "\n".join(texts), value
    raise FieldError(path, f"must be a string or an array of content parts, got {_type_name(value)}")


def _tool_calls(value: Any, path: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise FieldError(path, f"must be an array, got {_type_name(value)}")
    calls = []
    for i, call in enumerate(value):
        here = f"{path}[{i}]"
        if not isinstance(call, dict):
            raise FieldError(here, f"must be an object, got {_type_name(call)}")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            raise FieldError(f"{here}.id", "required non-empty string")
        function = call.get("function")
        if not isinstance(function, dict):
            raise FieldError(f"{here}.function", "required object with 'name' and 'arguments'")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise FieldError(f"{here}.function.name", "required non-empty string")
        arguments = function.get("arguments", "")
        if isinstance(arguments, dict):
            # Some SDKs send arguments as an object; the chat format keeps them as a JSON string.
            arguments = orjson.dumps(arguments).decode()
        elif not isinstance(arguments, str):
            raise FieldError(f"{here}.function.arguments", "must be a JSON string")
        json_depth_check(arguments, f"{here}.function.arguments")
        calls.append(
            {"id": call_id, "type": call.get("type") or "function", "function": {"name": name, "arguments": arguments}}
        )
    return calls


def parse_message(value: Any, path: str) -> ParsedMessage:
    """Validate one chat message; `path` prefixes field names in errors."""
    if not isinstance(value, dict):
        raise FieldError(path, f"must be an object, got {_type_name(value)}")
    json_depth_check(value, path)
    role = value.get("role")
    if role not in ROLES:
        if role is None:
            raise FieldError(f"{path}.role", "required; one of system, user, assistant, tool")
        raise FieldError(f"{path}.role", f"unknown role {str(role)[:40]!r}; one of system, user, assistant, tool")

    tool_calls = None
    if value.get("tool_calls") is not None:
        if role != "assistant":
            raise FieldError(f"{path}.tool_calls", "only assistant messages carry tool calls")
        tool_calls = _tool_calls(value["tool_calls"], f"{path}.tool_calls") or None

    raw_content = value.get("content")
    if raw_content is None:
        if role != "assistant" or (tool_calls is None and "refusal" not in value):
            raise FieldError(f"{path}.content", "required (null only for an assistant turn with tool calls)")
        content, parts = "", None
    else:
        content, parts = _content(raw_content, f"{path}.content")

    tool_call_id = value.get("tool_call_id", "")
    if role == "tool":
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise FieldError(f"{path}.tool_call_id", "required non-empty string on a tool message")
    elif not isinstance(tool_call_id, str):
        raise FieldError(f"{path}.tool_call_id", "must be a string")

    name = value.get("name", "")
    if not isinstance(name, str):
        raise FieldError(f"{path}.name", f"must be a string, got {_type_name(name)}")

    serving: dict[str, Any] = {}
    if role == "assistant":
        for key in SERVING_KEYS:
            if value.get(key) is not None:
                serving[key] = value[key]
    return ParsedMessage(
        role=role,
        content=content,
        content_parts=parts,
        name=name[:200],
        tool_calls=tool_calls,
        tool_call_id=tool_call_id[:200],
        raw=value,
        serving=serving,
    )


def parse_tools(value: Any, path: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise FieldError(path, f"must be an array, got {_type_name(value)}")
    for i, tool in enumerate(value):
        if not isinstance(tool, dict):
            raise FieldError(f"{path}[{i}]", f"must be an object, got {_type_name(tool)}")
        json_depth_check(tool, f"{path}[{i}]")
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise FieldError(f"{path}[{i}].function.name", "required non-empty string")
        params = function.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise FieldError(f"{path}[{i}].function.parameters", "must be a JSON Schema object")
    return value


def parse_timestamp(value: Any, path: str) -> datetime | None:
    """ISO 8601; a timestamp without an offset is taken as UTC."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise FieldError(path, f"must be an ISO 8601 string, got {_type_name(value)}")
    try:
        parsed = parse_datetime(value)
    except ValueError:
        parsed = None
    if parsed is None:
        raise FieldError(path, f"not an ISO 8601 timestamp: {value[:40]!r}")
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed


def optional_string(item: dict[str, Any], key: str, *, max_length: int = 200) -> str:
    value = item.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise FieldError(key, f"must be a string, got {_type_name(value)}")
    if len(value) > max_length:
        raise FieldError(key, f"longer than {max_length} characters")
    if "\x00" in value:
        # An identifier is looked up and compared as it is; PostgreSQL cannot hold NUL.
        raise FieldError(key, "contains a NUL character")
    return value
