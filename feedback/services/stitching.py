"""Conversation stitching: joining gateway calls that name no trace into conversations.

A chat harness resends the whole conversation on every call, and nothing else says which
calls belong together. So every logged exchange leaves a *tip*: the digest of the history the
client now holds (the call's messages followed by the answer it received), pointing to the
trace that holds it. A later call whose messages start with such a history continues that
trace; what follows the history in the call (a tool result, the user's next words) and the
new answer are appended by the same prefix rule as a call that names its trace.

- **Digests.** A message's digest covers its role, text, tool calls (name, id, arguments as
  JSON) and tool-call id (`message_digests.message_digest`, the same comparison the prefix rule uses,
  so SDK re-serialisation does not matter); a history's digest chains them
  (`history_chain`), so every prefix of a call is hashed in one pass and looked up in one
  indexed query, whatever the conversation's length: `O(assistant turns of the call)`
  digests, one round trip per batch of exchanges.
- **Only after an answer.** Candidate prefixes end on an assistant message — the end of an
  earlier exchange. Two conversations that share a system prompt (or a system prompt and a
  first user message) never match before an answer, so they never merge.
- **Scope.** Tips are per deployment and live `PRACTICUM_GATEWAY_STITCH_WINDOW_SECONDS`
  (6 h by default); the log writer deletes older ones. A history's digest starts from its
  caller's scope (`stitch_scope`: the API key and the session id the call names), so calls of
  two customers — another session, another key — never join, however alike their words.
- **Identical openings.** Two conversations may open with the same words and the same answer
  (a deterministic agent, a repeated task): the digest then points to two traces. A call goes
  to the one that already holds its continuation (a retry), else to one nobody has continued
  yet, else to the most recent — so each conversation keeps its own trace.
- **Retries.** A retry after a failed or undelivered call (the SDK's own retries: an upstream
  error, a client timeout) repeats the request: it continues the same trace, the failed turn
  stays marked (`finish_reason` `error` / `client_disconnect`) and is skipped when matching.
  A harness that re-asks the same request after receiving an answer gets a *fork* if the new
  answer differs (it is a regenerated answer), nothing new if it is the same.
- **Forks.** A call that repeats a logged history and then differs from what its trace holds
  (an edited message, a rewound conversation) goes to a fork `<trace>~<position>.<digest>`
  linked by `forked_from`/`forked_at`. A history rewritten from the start (summarised, or cut
  to a window) matches no prefix; if it keeps the first message (the system prompt) and ends
  with an answer the gateway gave in that conversation, it becomes a new trace linked as a
  fork of that conversation at that answer.
- **`n > 1`.** Choice 0 goes to the conversation's trace, each other choice to a fork; each
  leaves its tip, so the conversation continues in whichever trace holds the choice the
  harness kept.
- **A second model on the same deployment** (a simulated user, a judge, a summariser) sends
  another system prompt and another history: its calls make traces of their own (the
  requested `model` name is kept on each trace, to filter them).

All of this runs in the log writer (`exchanges_record`), never on the response path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings
from django.db import connection
from django.db.models import F, Window
from django.db.models.functions import RowNumber

from feedback.models import ConversationTip
from feedback.services.message_digests import content_digest

TIPS_PER_HISTORY = 4
_TIPS_SQL = f"""
SELECT id, digest, last_digest, external_id, length, continued, created_at FROM (
    SELECT tip.id, tip.digest, tip.last_digest, trace.external_id, tip.length, tip.continued, tip.created_at,
           row_number() OVER (PARTITION BY tip.digest, tip.continued ORDER BY tip.created_at DESC) AS rank
    FROM {ConversationTip._meta.db_table} tip JOIN feedback_trace trace ON trace.id = tip.trace_id
    WHERE tip.deployment_id = %s AND tip.created_at >= %s AND tip.digest = ANY(%s)
) ranked WHERE rank <= %s
"""
_TIPS_INSERT_SQL = f"""
INSERT INTO {ConversationTip._meta.db_table} (deployment_id, digest, last_digest, trace_id, length, continued, created_at)
SELECT d, g, l, t, n, c, %s FROM unnest(%s::bigint[], %s::text[], %s::text[], %s::bigint[], %s::integer[], %s::boolean[])
     AS v(d, g, l, t, n, c)
ON CONFLICT (deployment_id, digest, trace_id) DO NOTHING
"""

if TYPE_CHECKING:
    from feedback.gateway.exchange import Exchange


class TraceBatch(Protocol):
    """The capture's batch as the stitcher reads it: the traces of a deployment loaded once,
    locked, by key (feedback/services/capture.py), each with its `id` and message `digests`."""

    states: dict[tuple[int, str], Any]

    def load(self, deployment_id: int, keys: Sequence[str]) -> None: ...


def stitch_scope(*, session_id: str, api_key_id: int | None) -> str:
    """Where a history may be continued: by calls with the same API key and session id. The
    chain of a history starts from it, so no tip is ever shared across callers."""
    return hashlib.blake2b(f"{api_key_id or ''}\x00{session_id}".encode(), digest_size=16).hexdigest()


def history_chain(digests: Sequence[str], *, after: str = "") -> list[str]:
    """`out[i]` is the digest of the history `digests[: i + 1]` (message digests chained),
    continuing the chain that ends in `after` when given."""
    out, h = [], bytes.fromhex(after)
    for d in digests:
        h = hashlib.blake2b(h + d.encode(), digest_size=16).digest()
        out.append(h.hex())
    return out


def answer_key(first: str, answer: str, *, scope: str) -> str:
    """An answer's digest within a conversation of `scope` that opens with `first` (for
    rewritten histories)."""
    return hashlib.blake2b(f"{scope}:{first}:{answer}".encode(), digest_size=10).hexdigest()


@dataclass(slots=True)
class _Tip:
    id: int | None  # None until written (a tip of this batch)
    key: str  # the trace's external id
    length: int
    continued: bool
    order: float  # later is more recent
    digest: str = ""
    last: str = ""


@dataclass(slots=True)
class _Call:
    """What stitching needs of one exchange's request."""

    digests: list[str]
    chain: list[str]
    scope: str
    candidates: list[int] = field(default_factory=list)  # prefix lengths ending on an assistant message
    last: str = ""  # answer_key of the request's last assistant message


class Stitcher:
    """Resolves the trace of each stitched exchange of a batch and records the new tips."""

    def __init__(self, batch: TraceBatch, now: datetime) -> None:
        self.batch = batch
        self.now = now
        self.cutoff = now - timedelta(seconds=settings.GATEWAY_STITCH_WINDOW_SECONDS)
        self.by_digest: dict[tuple[int, str], list[_Tip]] = {}
        self.by_last: dict[tuple[int, str], list[_Tip]] = {}
        self.calls: dict[int, _Call] = {}
        self.new: list[tuple[int, _Tip]] = []
        self.continued_ids: set[int] = set()
        self.keys: dict[int, set[str]] = {}  # the traces the stored tips point to, per deployment
        self.fetched: set[tuple[int, str]] = set()
        self._order = 0.0

    # -- before the batch: one query per deployment ---------------------------------------------

    def prepare(self, exchanges: Sequence[Exchange]) -> None:
        wanted: dict[int, set[str]] = {}
        for ex in exchanges:
            digests = [content_digest(m) for m in ex.messages]
            scope = stitch_scope(session_id=ex.session_id, api_key_id=ex.api_key_id)
            call = _Call(digests=digests, chain=history_chain(digests, after=scope), scope=scope)
            answers = [i + 1 for i, m in enumerate(ex.messages) if m.role == "assistant"][::-1]
            # The whole request too: the resend of a call whose answer never reached the client.
            call.candidates = ([len(digests)] if not answers or answers[0] != len(digests) else []) + answers
            # Up front, only the longest history ending on an answer (and the resend): a call
            # nearly always continues its conversation's latest exchange. Shorter ones (a
            # rewound history) are looked up when that fails.
            first = call.candidates[: 2 if call.candidates[0] == len(digests) else 1]
            wanted.setdefault(ex.deployment_id, set()).update(call.chain[k - 1] for k in first)
            if answers:
                call.last = answer_key(digests[0], digests[answers[0] - 1], scope=scope)
            self.calls[id(ex)] = call
        for dep, prefixes in wanted.items():
            self._fetch(dep, prefixes)

    def _fetch(self, dep: int, digests: set[str]) -> None:
        """Read the stored tips of these histories. Many conversations can open alike (the
        same greeting and answer): per history, the few most recent open tips and the few most
        recent continued ones are enough."""
        digests = {d for d in digests if (dep, d) not in self.fetched}
        if not digests:
            return
        self.fetched.update((dep, d) for d in digests)
        if connection.vendor == "postgresql":
            # One array parameter: Django's IN (…) costs ~0.2 ms of Python per value.
            with connection.cursor() as cursor:
                cursor.execute(_TIPS_SQL, [dep, self.cutoff, sorted(digests), TIPS_PER_HISTORY])
                rows = cursor.fetchall()
        else:
            rank = Window(RowNumber(), partition_by=[F("digest"), F("continued")], order_by=F("created_at").desc())
            rows = list(
                ConversationTip.objects.filter(deployment_id=dep, created_at__gte=self.cutoff, digest__in=digests)
                .annotate(rank=rank)
                .filter(rank__lte=TIPS_PER_HISTORY)
                .values_list("id", "digest", "last_digest", "trace__external_id", "length", "continued", "created_at")
            )
        for tip_id, digest, last, key, length, continued, created in rows:
            tip = _Tip(tip_id, key, length, continued, created.timestamp(), digest, last)
            self.keys.setdefault(dep, set()).add(key)
            self.by_digest.setdefault((dep, digest), []).append(tip)

    def _by_last(self, dep: int, last: str) -> list[_Tip]:
        """Tips of answers equal to `last` (this batch's, and the most recent stored one):
        asked only for a call whose history matched no prefix, so rarely."""
        tips = [t for t in self.by_last.get((dep, last), ()) if t.last]
        row = (
            ConversationTip.objects.filter(deployment_id=dep, last_digest=last, created_at__gte=self.cutoff)
            .order_by("-created_at")
            .values_list("id", "digest", "trace__external_id", "length", "continued", "created_at")
            .first()
        )
        if row is not None:
            tip_id, digest, key, length, continued, created = row
            tips.append(_Tip(tip_id, key, length, continued, created.timestamp(), digest, last))
        return tips

    # -- per exchange, in order -----------------------------------------------------------------

    def resolve(self, ex: Exchange) -> tuple[str | None, dict | None]:
        """The trace key the exchange continues (None: a new conversation), and for a history
        rewritten from the start, the fork link of the new trace."""
        call = self.calls[id(ex)]
        dep = ex.deployment_id
        for length in call.candidates:
            digest = call.chain[length - 1]
            if (dep, digest) not in self.fetched and (dep, digest) not in self.by_digest:
                self._fetch(dep, {call.chain[k - 1] for k in call.candidates})
            # A resend tip (no answer) serves one resend only: another conversation that opens
            # with the same words later is not a retry.
            tips = [t for t in self.by_digest.get((dep, call.chain[length - 1]), ()) if t.last or not t.continued]
            if tips:
                tip = self._choose(dep, tips, call, length)
                if not tip.continued:
                    tip.continued = True
                    if tip.id is not None:
                        self.continued_ids.add(tip.id)
                return tip.key, None
        if call.last:
            tips = self._by_last(dep, call.last)
            if tips:
                parent = max(tips, key=lambda t: t.order)
                return None, {"from": parent.key, "position": parent.length, "rewritten": True}
        return None, None

    def _choose(self, dep: int, tips: list[_Tip], call: _Call, length: int) -> _Tip:
        if len(tips) == 1:
            return tips[0]
        # Several conversations reached this history. The one that already holds what this
        # call sends after it is the same conversation (a retry); else an open one.
        self.batch.load(dep, sorted({t.key for t in tips}))
        rest = call.digests[length:]
        for tip in sorted(tips, key=lambda t: -t.order):
            state = self.batch.states.get((dep, tip.key))
            if state is None:
                continue
            stored = [d for d in state.digests if d is not None][length:]
            if stored and all(a == b for a, b in zip(stored, rest, strict=False)):
                return tip
        open_tips = [t for t in tips if not t.continued]
        return max(open_tips or tips, key=lambda t: t.order)

    def register(self, ex: Exchange, key: str, answer_digest: str | None) -> None:
        """The history the client now holds (the request and this answer) leads to `key`.
        Without an answer (the call failed, or the client left before it), the request itself
        leads there, once: the client will resend it."""
        call = self.calls[id(ex)]
        self._order += 1
        order = self.now.timestamp() + self._order * 1e-6
        if answer_digest is None:
            tip = _Tip(None, key, len(call.digests), False, order, call.chain[-1], "")
        else:
            (digest,) = history_chain([answer_digest], after=call.chain[-1])
            last = answer_key(call.digests[0], answer_digest, scope=call.scope)
            tip = _Tip(None, key, len(call.digests) + 1, False, order, digest, last)
        dep = ex.deployment_id
        tips = self.by_digest.setdefault((dep, tip.digest), [])
        if any(t.key == key and (t.last or not t.continued) for t in tips):
            return  # the same history again (an identical answer): already known
        tips.append(tip)
        self.by_last.setdefault((dep, tip.last), []).append(tip)
        self.new.append((dep, tip))

    # -- after the batch's traces are written ------------------------------------------------------

    def write(self) -> None:
        rows: list[ConversationTip] = []
        for dep, tip in self.new:
            state = self.batch.states.get((dep, tip.key))
            if state is None or state.id is None:
                continue
            rows.append(
                ConversationTip(
                    deployment_id=dep,
                    digest=tip.digest,
                    last_digest=tip.last,
                    trace_id=state.id,
                    length=tip.length,
                    continued=tip.continued,
                    created_at=self.now,
                )
            )
        answers = [r for r in rows if r.last_digest]
        resends = [r for r in rows if not r.last_digest]
        if answers and connection.vendor == "postgresql":
            # From arrays: Django's bulk_create costs more Python per row than the insert.
            with connection.cursor() as cursor:
                cursor.execute(
                    _TIPS_INSERT_SQL,
                    [
                        self.now,
                        [r.deployment_id for r in answers],
                        [r.digest for r in answers],
                        [r.last_digest for r in answers],
                        [r.trace_id for r in answers],
                        [r.length for r in answers],
                        [r.continued for r in answers],
                    ],
                )
        elif answers:
            ConversationTip.objects.bulk_create(answers, ignore_conflicts=True)
        if resends:
            # A resend tip used up and registered again (the resend failed too) is fresh again.
            ConversationTip.objects.bulk_create(
                resends,
                update_conflicts=True,
                unique_fields=["deployment", "digest", "trace"],
                update_fields=["continued", "created_at"],
            )
        if self.continued_ids and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(
                    f"UPDATE {ConversationTip._meta.db_table} SET continued = true WHERE id = ANY(%s)",
                    [sorted(self.continued_ids)],
                )
        elif self.continued_ids:
            ConversationTip.objects.filter(id__in=sorted(self.continued_ids)).update(continued=True)


def conversation_tips_expire(*, now: datetime) -> int:
    """Delete tips older than the stitching window; returns how many."""
    cutoff = now - timedelta(seconds=settings.GATEWAY_STITCH_WINDOW_SECONDS)
    deleted, _ = ConversationTip.objects.filter(created_at__lt=cutoff).delete()
    return deleted
