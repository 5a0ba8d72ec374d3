"""Reading and writing the transcript of a support-desk episode: a lookup as the episode
logs it, the actions done on an order, a refund amount as the tool reads it."""

from __future__ import annotations

import json
from typing import Any

from training.environments.records import (
    call_key,
    key_normalized,
)


def lookup_messages(order_id: str, row: dict[str, Any], call_id: str = "call_0") -> list[dict[str, Any]]:
    """The assistant's lookup of `order_id` and the tool's answer showing `row`, as an
    episode logs them."""
    arguments = json.dumps({"order_id": order_id})
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "lookup_order", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "name": "lookup_order", "content": json.dumps(row)},
    ]


def _looked_up(messages: list[dict[str, Any]], order_id: str) -> dict[str, Any] | None:
    """The row the conversation's last successful lookup of `order_id` returned."""
    found = None
    for m in messages:
        if m.get("role") != "tool":
            continue
        try:
            row = json.loads(str(m.get("content") or ""))
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("order_id") == order_id:
            found = row
    return found


def refund_amount(value: Any) -> Any:
    """A refund's `amount` argument as the tool reads it: a string such as "$12.50" becomes
    its number (ValueError when it is none); any other value is returned as it is."""
    return float(value.strip().lstrip("$")) if isinstance(value, str) else value


def done_actions(messages: list[dict[str, Any]], order_id: str) -> set[str]:
    """The tools called on `order_id` in `messages` whose result was not an error. The id
    is read as the tools read it (trimmed, any case): a lookup of "jl221861" found the order.
    A result answers a call of the assistant message just before it, the first one not yet
    answered with its id: call ids repeat from turn to turn (a served turn's first call is
    `call_0` every time) and may repeat within one."""
    wanted = key_normalized(order_id)
    waiting: list[tuple[str, str | None]] = []  # (call id, tool name if it names the order)
    done: set[str] = set()
    for m in messages:
        role = m.get("role")
        if role == "assistant":
            waiting = []
            calls = m.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                call_id = str(call.get("id", "")) if isinstance(call, dict) else ""
                value = call_key(call, "order_id")
                function = call.get("function") if isinstance(call, dict) else None
                name = function.get("name") if isinstance(function, dict) else None
                on_order = value is not None and key_normalized(value) == wanted and isinstance(name, str)
                waiting.append((call_id, name if on_order else None))
        elif role == "tool":
            call_id = str(m.get("tool_call_id", ""))
            match = next((i for i, (cid, _) in enumerate(waiting) if cid == call_id), None)
            if match is None:
                continue
            name = waiting.pop(match)[1]
            text = _tool_text(m.get("content"))
            if name and text is not None and not text.startswith("error"):
                done.add(name)
    return done


def _tool_text(content: Any) -> str | None:
    """A logged tool result's text (a string, or the text parts of a content list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "".join(parts) if parts else None
    return None
