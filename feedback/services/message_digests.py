"""What a message says, as a digest: how the gateway's capture, conversation stitching and
the stitching backfill compare messages (by meaning: role, text, tool calls, tool call id,
name; not by their exact JSON, which SDKs re-serialise)."""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any

import orjson

from webapp.kernel.chat_format import ParsedMessage

# Turns the client never received whole (a failed call, a stream the client left): kept in
# the trace, ignored when matching a history.
UNSEEN_FINISH_REASONS = frozenset({"error", "client_disconnect"})


def message_digest(
    role: str, content: str, tool_calls: list[dict[str, Any]] | None, tool_call_id: str, name: str
) -> str:
    """A stable digest of what a message says (the same in every process)."""
    calls = []
    for call in tool_calls or []:
        function = call.get("function") or {}
        arguments = function.get("arguments", "")
        if isinstance(arguments, str):
            with contextlib.suppress(orjson.JSONDecodeError):
                arguments = orjson.loads(arguments) if arguments else ""
        calls.append((call.get("id") or "", function.get("name") or "", arguments))
    body = orjson.dumps((role, content or "", calls, tool_call_id or "", name or ""), option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(body, digest_size=10).hexdigest()


def parsed_digest(m: ParsedMessage) -> str | None:
    """The message's digest; None for a turn the client never saw."""
    if m.role == "assistant" and m.serving.get("finish_reason") in UNSEEN_FINISH_REASONS:
        return None
    return content_digest(m)


def content_digest(m: ParsedMessage) -> str:
    """The digest of what the message says, computed once per message."""
    if m.digest is None:
        m.digest = message_digest(m.role, m.content, m.tool_calls, m.tool_call_id, m.name)
    return m.digest
