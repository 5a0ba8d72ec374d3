"""Which version serves a call while a progressive release splits a deployment's traffic.

A conversation is served by one version from its first call to its last. The gateway keeps no
shared state for it: a conversation's *key* hashes to a fixed point in [0, 1), and the
candidate serves it when that point is below the candidate's share. Every gateway process
computes the same answer, and as a plan's share only grows, a conversation the candidate
served keeps it at every later step.

The key, from what every call of one conversation carries:

1. the session id (`X-Practicum-Session-Id`, or `metadata.session_id`), when the client sends one;
2. else the trace id the client names (`X-Practicum-Trace-Id`, `metadata.trace_id`);
3. else, for a stitched conversation, the API key and the conversation's opening (the messages
   up to and including the first user message): a harness resends the whole history on every
   call, so each call of a conversation opens alike (two conversations that open alike share a
   point: still each served by one version).

A step that widens the share would move the conversations whose point falls between the old
and the new share from live to the candidate mid-way. So each process also remembers, for a
while (`PRACTICUM_GATEWAY_PIN_SECONDS`), which version served each conversation it routed
(`Pins`): a pinned conversation stays where it was. Behind several gateway processes, a
conversation in flight across a step change that reaches a process which never saw it is
routed by its point alone (the limitation decision 0047 records).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

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


class Pins:
    """Conversation key -> the version id that served it, for `ttl` seconds after its last call;
    at most `size` kept (the oldest go first)."""

    def __init__(self, *, ttl: float, size: int = 100_000) -> None:
        self.ttl, self.size = ttl, size
        self._items: OrderedDict[tuple[int, str], tuple[float, int]] = OrderedDict()

    def get(self, deployment_id: int, key: str) -> int | None:
        item = self._items.get((deployment_id, key))
        if item is None or item[0] < time.monotonic():
            return None
        return item[1]

    def put(self, deployment_id: int, key: str, version_id: int) -> None:
        if self.ttl <= 0:
            return
        k = (deployment_id, key)
        self._items[k] = (time.monotonic() + self.ttl, version_id)
        self._items.move_to_end(k)
        while len(self._items) > self.size:
            self._items.popitem(last=False)


def serves_candidate(*, key: str, share: float, pinned: int | None, live_id: int, candidate_id: int) -> bool:
    """Whether the candidate serves this call: as pinned, when pinned to one of the two, else by
    the conversation's point against the share."""
    if pinned == candidate_id:
        return True
    if pinned == live_id:
        return False
    return conversation_bucket(key) < share


def route_for_call(
    route, pins: Pins, *, deployment_id: int, key_id: int | None, session: str, trace_key: str | None, messages
) -> tuple[Any, bool]:
    """The route that serves this call (the live one, or its canary), and whether it is the canary."""
    canary = route.canary
    if canary is None:
        return route, False
    key = conversation_key(session=session, trace_key=trace_key, api_key_id=key_id, messages=messages)
    chosen = serves_candidate(
        key=key,
        share=route.canary_share,
        pinned=pins.get(deployment_id, key),
        live_id=route.version_id,
        candidate_id=canary.version_id,
    )
    served = canary if chosen else route
    pins.put(deployment_id, key, served.version_id)
    return served, chosen


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
