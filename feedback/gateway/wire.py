"""What the gateway reads from and writes to the ASGI connection: a request's body within its
limit and deadline, a client-chosen id checked, the response headers, a JSON response, and an
upstream answer stripped to what the client asked for (log-probs, token ids, usage)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from feedback.gateway.errors import GatewayError
from feedback.gateway.exchange import Exchange

TRACE_HEADER = b"x-practicum-trace-id"
SESSION_HEADER = b"x-practicum-session-id"

# C0 and C1 control characters (CR, LF, NUL, …) and DEL: none belongs in an identifier that is
# echoed in a response header and looked up in PostgreSQL (whose text cannot hold NUL).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def client_identifier(value: Any, param: str, max_length: int, *, allow_empty: bool = False) -> str | None:
    """A client-chosen trace or session id, or a 400 naming the field and the reason."""
    if value is None or (allow_empty and value == ""):
        return None
    if not isinstance(value, str) or not 0 < len(value) <= max_length:
        raise GatewayError(400, f"a non-empty string of at most {max_length} characters", param=param)
    if (bad := _CONTROL.search(value)) is not None:
        raise GatewayError(
            400, f"contains a control character ({ord(bad.group()):#04x}); send printable text only", param=param
        )
    return value


def response_headers(trace_key: str | None, version: str | None, content_type: bytes) -> list[tuple[bytes, bytes]]:
    out = [(b"content-type", content_type)]
    if trace_key is not None:
        out.append((TRACE_HEADER, trace_key.encode()))
    if version:
        out.append((b"x-practicum-model-version", version.encode()))
    return out


def exchange_trace_header(exchange: Exchange) -> str | None:
    """The trace id to send back: the one the client named, or the new trace's when the
    deployment does not stitch. A stitched call's trace is found later, off the response path,
    so none is sent (customer feedback refers to the completion's `id`)."""
    return None if exchange.stitch else exchange.trace_key


async def send_json(send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": headers or [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def read_body(receive, limit: int, *, declared: bytes | None = None, timeout: float | None = None) -> bytes:
    """The body, refused from its Content-Length (`declared`) when that is over `limit`, cut
    off as it streams past `limit`, and given up on after `timeout` seconds."""
    # ASCII digits only: `int()` refuses other scripts' digits, which `isdigit()` takes.
    if declared is not None and re.fullmatch(rb"[0-9]{1,30}", declared.strip()) and int(declared) > limit:
        raise GatewayError(413, f"request body of {int(declared)} bytes; at most {limit}", code="request_too_large")
    parts, size = [], 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise GatewayError(400, "the client disconnected before sending the whole body")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise GatewayError(413, f"request body over {limit} bytes", code="request_too_large")
                parts.append(chunk)
                if not message.get("more_body"):
                    return b"".join(parts)
    except TimeoutError:
        raise GatewayError(
            408, f"the request body did not arrive within {timeout:g} seconds", code="request_timeout"
        ) from None


def choice_stripped(choice: dict[str, Any], logprobs: bool, token_ids: bool) -> dict[str, Any]:
    choice = dict(choice)
    if not logprobs:
        choice["logprobs"] = None
    if not token_ids:
        choice.pop("token_ids", None)
    return choice


def response_stripped(body: dict[str, Any], logprobs: bool, token_ids: bool) -> dict[str, Any]:
    """The response as the client asked for it (the log keeps the whole one)."""
    out = dict(body)
    out["choices"] = [choice_stripped(c, logprobs, token_ids) for c in body.get("choices") or []]
    if not token_ids:
        out.pop("prompt_token_ids", None)
    return out


def chunk_stripped(chunk: dict[str, Any], logprobs: bool, token_ids: bool, usage: bool) -> dict[str, Any] | None:
    if not usage and chunk.get("usage") and not chunk.get("choices"):
        return None  # the usage-only chunk the client did not ask for
    out = response_stripped(chunk, logprobs, token_ids)
    if not usage:
        out.pop("usage", None)
    return out
