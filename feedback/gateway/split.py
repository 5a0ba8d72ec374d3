"""Which version serves a call while a progressive release splits a deployment's traffic.

A conversation is served by one version from its first call to its last. A conversation's
*key* hashes to a fixed point in [0, 1); a conversation that *begins* while the split exists
goes to the candidate when its point is below the candidate's share at that moment. Every
later call goes to the version that served the conversation before (`feedback.gateway.pins`:
this process's memory, else the trace store), so neither a wider step, nor the first step
beginning, nor another gateway process, nor a restart moves a conversation under way.

The key, from what every call of one conversation carries:

1. the session id (`X-Practicum-Session-Id`, or `metadata.session_id`), when the client sends one;
2. else the trace id the client names (`X-Practicum-Trace-Id`, `metadata.trace_id`);
3. else, for a stitched conversation, the API key and the conversation's opening (the messages
   up to and including the first user message): a harness resends the whole history on every
   call, so each call of a conversation opens alike. A stitched call that resends an answer
   continues a conversation: the pin for it adds the first answer to the opening (two
   conversations that open alike get answers of their own), and on a miss the stitcher's tip
   of the history it resends says which version served it — also for a history trimmed from
   the start that keeps its first message (see docs/how-to/progressive-release.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from feedback.gateway.pins import Pins, key_digest, may_continue

_SPAN = float(1 << 64)


def conversation_bucket(key: str) -> float:
    """The conversation's fixed point in [0, 1)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SPAN


def conversation_key(*, session: str, trace_key: str | None, api_key_id: int | None, messages: Sequence[Any]) -> str:
    """The key of the conversation a call belongs to (the module's rule)."""
    if session:
        return "s:" + session
    if trace_key:
        return "t:" + trace_key
    opening: list[str] = []
    for message in messages:
        opening.append(f"{message.role}\x1f{message.content}")
        if message.role == "user":
            break
    return f"o:{api_key_id or 0}\x1e" + "\x1e".join(opening)


def serves_candidate(*, key: str, share: float, pinned: int | None, live_id: int, candidate_id: int) -> bool:
    """Whether the candidate serves this call: as pinned, when pinned to one of the two, else by
    the conversation's point against the share."""
    if pinned == candidate_id:
        return True
    if pinned == live_id:
        return False
    return conversation_bucket(key) < share


def _with_answer(key: str, answer: Any) -> str:
    return f"{key}\x1d{answer or ''}"


def pin_key(key: str, messages: Sequence[Any]) -> str:
    """What a pin remembers a conversation by: its key, and for a stitched call that continues
    a conversation, its first answer too (so two conversations that open alike, one begun
    before a step and one after, keep a pin each)."""
    if not key.startswith("o:"):
        return key
    for message in messages:
        if message.role == "assistant":
            return _with_answer(key, message.content)
    return key


def first_answer(exchange) -> str | None:
    """The answer a stitched conversation's first call received (choice 0), as its next call
    will resend it; None when the call failed."""
    if exchange.response is not None:
        choices = exchange.response.get("choices") or [{}]
        return (choices[0].get("message") or {}).get("content") or ""
    if exchange.chunks is not None:
        parts = []
        for chunk in exchange.chunks:
            for choice in chunk.get("choices") or ():
                if choice.get("index", 0) == 0:
                    parts.append((choice.get("delta") or {}).get("content") or "")
        return "".join(parts)
    return None


def pin_first_answer(pins: Pins, *, deployment_id: int, key: str, exchange) -> None:
    """Pin a stitched conversation by its opening and first answer once that answer is known,
    so its next call finds its version in this process before the log writer has stored it."""
    answer = first_answer(exchange)
    if answer is not None and exchange.version_id is not None:
        pins.put(deployment_id, key_digest(_with_answer(key, answer)), exchange.version_id)


Lookup = Callable[[], Awaitable[int | None]]


async def route_for_call(
    route,
    pins: Pins,
    *,
    deployment_id: int,
    key_id: int | None,
    session: str,
    trace_key: str | None,
    messages,
    served_before: Lookup,
) -> tuple[Any, bool, str | None]:
    """The route that serves this call (the live one, or its canary), whether it is the canary,
    and for the first call of a stitched conversation its key (to pin with its answer,
    `pin_first_answer`). `served_before` asks the trace store which version served the
    conversation; it is awaited only on a pin miss for a call that may continue one."""
    canary = route.canary
    pins.follow(deployment_id, route.rollout_id if canary is not None else None)
    if canary is None:
        return route, False, None
    key = conversation_key(session=session, trace_key=trace_key, api_key_id=key_id, messages=messages)
    continues = may_continue(session=session, trace_key=trace_key, messages=messages)
    digest = key_digest(pin_key(key, messages))
    pinned = pins.get(deployment_id, digest)
    if pinned is None and continues:
        pinned = await served_before()
    chosen = serves_candidate(
        key=key, share=route.canary_share, pinned=pinned, live_id=route.version_id, candidate_id=canary.version_id
    )
    served = canary if chosen else route
    if continues:
        pins.put(deployment_id, digest, served.version_id)
    return served, chosen, None if continues else key


RELEASE_KEY = "practicum_release"


def release_metadata(metadata: dict[str, Any], route, canary: bool) -> dict[str, Any]:
    """The trace's metadata: the client's, without the ids the gateway reads from it, and, while
    a progressive release splits the traffic, which side of it served the call (a client's own
    value under that name is dropped: only the gateway says what was a canary)."""
    out = {k: v for k, v in metadata.items() if k not in ("trace_id", "session_id", RELEASE_KEY)}
    if route.canary is not None:
        out[RELEASE_KEY] = {
            "rollout": route.rollout_id,
            "canary": canary,
            "version": route.canary.version_name if canary else route.version_name,
        }
    return out
