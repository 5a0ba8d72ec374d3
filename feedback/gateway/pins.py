"""Which version already served a conversation, while a progressive release splits its traffic.

Two layers, so a conversation keeps its version across gateway processes, restarts and step
changes without a database round trip on every call:

- `Pins`, in each process: the 16-byte digest of a conversation's key -> the version that
  served it, for `PRACTICUM_GATEWAY_PIN_SECONDS` after its last call; at most `size` entries
  (the least recently used go first), expired ones purged as new ones come, and all of a
  deployment's dropped when its split ends or another release's split replaces it.
- `served_version_sync`, on a miss: the trace store, which the log writer fills for every
  call with or without a split, says which version served the conversation's latest trace —
  by its session id, the trace id the client names, or for a stitched conversation the tip
  the stitcher left for the history the call resends (`feedback.services.stitching`). Asked
  once per conversation per process; never for the first call of a stitched conversation
  (a call that resends no answer has nothing to continue).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from feedback.models import ConversationTip, Trace
from feedback.services.message_digests import content_digest
from feedback.services.stitching import answer_key, history_chain, stitch_scope

logger = logging.getLogger(__name__)

DIGEST_SIZE = 16


def key_digest(key: str) -> bytes:
    """The fixed-size form a pin keeps of a conversation's key (an opening may be kilobytes)."""
    return hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=DIGEST_SIZE).digest()


class Pins:
    """(deployment, key digest) -> the version id that served the conversation."""

    def __init__(self, *, ttl: float, size: int = 100_000) -> None:
        self.ttl, self.size = ttl, size
        # In order of last use: as every entry lives `ttl` after its last use, the expired
        # ones are at the front, and purging them costs nothing per call.
        self._items: OrderedDict[tuple[int, bytes], tuple[float, int]] = OrderedDict()
        self._rollouts: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def follow(self, deployment_id: int, rollout_id: int | None) -> None:
        """Drop the deployment's pins when its split ended or another release's began: they
        said which side of a split that no longer exists served a conversation."""
        if self._rollouts.get(deployment_id) == rollout_id:
            return
        had = self._rollouts.pop(deployment_id, None)
        if rollout_id is not None:
            self._rollouts[deployment_id] = rollout_id
        if had is not None:
            for k in [k for k in self._items if k[0] == deployment_id]:
                del self._items[k]

    def get(self, deployment_id: int, digest: bytes) -> int | None:
        item = self._items.get((deployment_id, digest))
        if item is None:
            return None
        if item[0] < time.monotonic():
            del self._items[(deployment_id, digest)]
            return None
        return item[1]

    def put(self, deployment_id: int, digest: bytes, version_id: int) -> None:
        if self.ttl <= 0:
            return
        now = time.monotonic()
        k = (deployment_id, digest)
        self._items[k] = (now + self.ttl, version_id)
        self._items.move_to_end(k)
        items = self._items
        while items:
            first = next(iter(items.values()))
            if first[0] >= now and len(items) <= self.size:
                break
            items.popitem(last=False)


_RECENT = 20


def _stitched_version(deployment_id: int, api_key_id: int | None, messages: Sequence[Any]) -> int | None:
    """The version of the trace the stitcher continues for this call: the tip of the longest
    history it resends that ends on an answer (any shorter one too: the latest exchange may
    not be logged yet). Else, for a history trimmed or rewritten from the start that keeps its
    first message, the tips of its last answer given later in a conversation than the call
    places it (so a shorter history), when they all name one version: an answer many
    conversations share (a fixed greeting) says nothing, and the call goes by its point."""
    answers = [i for i, m in enumerate(messages) if m.role == "assistant"]
    if not answers:
        return None
    digests = [content_digest(m) for m in messages[: answers[-1] + 1]]
    scope = stitch_scope(session_id="", api_key_id=api_key_id)
    chain = history_chain(digests, after=scope)
    tips = ConversationTip.objects.filter(
        deployment_id=deployment_id,
        created_at__gte=timezone.now() - timedelta(seconds=settings.GATEWAY_STITCH_WINDOW_SECONDS),
    )
    version = (
        tips.filter(digest__in=[chain[i] for i in answers])
        .order_by("-length", "-created_at")
        .values_list("trace__model_version_id", flat=True)
        .first()
    )
    if version is not None:
        return version
    last = answer_key(digests[0], digests[-1], scope=scope)
    later = tips.filter(last_digest=last, length__gt=len(digests)).order_by("-created_at")
    versions = set(later.values_list("trace__model_version_id", flat=True)[:_RECENT])
    return versions.pop() if len(versions) == 1 else None


def served_version_sync(
    *, deployment_id: int, session: str, trace_key: str | None, api_key_id: int | None, messages: Sequence[Any]
) -> int | None:
    """The version that served the conversation's latest logged call, or None (none logged, or
    the database did not answer: the call is then routed by its point, not refused)."""
    try:
        return _served_version(deployment_id, session, trace_key, api_key_id, messages)
    except DatabaseError as exc:
        logger.warning("the gateway could not read which version served a conversation (%s)", exc)
        return None


def _served_version(deployment_id, session, trace_key, api_key_id, messages) -> int | None:
    if session:
        rows = Trace.objects.filter(deployment_id=deployment_id, session_id=session).order_by("-started_at", "-id")
    elif trace_key:
        rows = Trace.objects.filter(deployment_id=deployment_id, external_id=trace_key)
    else:
        return _stitched_version(deployment_id, api_key_id, messages)
    return rows.values_list("model_version_id", flat=True).first()


def may_continue(*, session: str, trace_key: str | None, messages: Sequence[Any]) -> bool:
    """Whether the call may continue a conversation already logged: always with a session or
    a named trace; a stitched call only when it resends an answer."""
    return bool(session or trace_key) or any(m.role == "assistant" for m in messages)
