"""Stitching traces already stored: the gateway traces of calls that named no trace (before
stitching, or with it off), each holding the whole history so far, joined into one trace per
conversation by the same rule as live stitching (`feedback/services/stitching.py`).

Only traces the gateway named itself are touched (marked `raw.named_by_gateway` when
created; a trace stored before that mark is taken by its id, `gw-<32 hex digits>`), and none
with a fork link; a trace a client named is never merged, whatever its id looks like. Traces are taken in the order they started. A trace
whose messages start with a conversation's history (up to one of its answers):

- extends it (the conversation's history is a prefix of the trace's): the trace's new
  messages move to the end of the conversation's trace with everything attached to them, and
  what is attached to its repeated messages (comments, ratings, corrections, judgements,
  customer feedback, training items) moves to the same message of the conversation's trace;
  then the now-empty copy is deleted;
- repeats it exactly (a retry that got the same answer): the same, with nothing to move;
- leaves it (an edited history, a regenerated answer): it stays, linked as a fork.

Only traces of the same session id are joined (the API key of a stored call is not known):
two customers' conversations that opened with the same words stay apart.

`traces_stitch_plan` only reads; `traces_stitch_apply` carries a plan out in one transaction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.dispatch import Signal

from feedback.models import (
    Comment,
    Correction,
    CustomerFeedback,
    FailureClusterMember,
    Grade,
    JudgeResult,
    Message,
    QueueItem,
    Trace,
    TraceFlag,
    TraceSource,
    TurnRating,
)
from feedback.services.grades import trace_outcomes_refresh
from feedback.services.ingest import trace_counts
from feedback.services.message_digests import UNSEEN_FINISH_REASONS, message_digest
from feedback.services.search import traces_search_index_later
from feedback.services.stitching import history_chain, stitch_scope
from webapp.kernel.chat_format import ParsedMessage

GENERATED_KEY = re.compile(r"^gw-[0-9a-f]{32}$")


@dataclass(slots=True)
class _Conversation:
    trace_id: int
    external_id: str
    digests: list[str]  # what the client saw, in order (failed turns left out)
    visible_ids: list[int]  # the message id behind each digest
    count: int  # messages stored (the next position)
    scope: str = ""  # `stitch_scope` of its session
    continued: bool = False


@dataclass(slots=True)
class Merge:
    source_id: int
    source_key: str
    target_id: int
    target_key: str
    same: dict[int, int]  # a repeated message of the source -> the conversation's message
    moved: list[tuple[int, int]]  # a new message of the source -> its position in the conversation


@dataclass(slots=True)
class Fork:
    trace_id: int
    trace_key: str
    parent_id: int
    parent_key: str
    at: int


@dataclass
class StitchPlan:
    traces: int = 0  # gateway-named traces read
    merges: list[Merge] = field(default_factory=list)
    forks: list[Fork] = field(default_factory=list)

    @property
    def conversations(self) -> int:
        return self.traces - len(self.merges)


def _rows(deployment_id: int, since: datetime | None):
    marked = Q(raw__named_by_gateway=True)
    # Stored before the gateway marked the traces it names: only its id tells.
    unmarked = ~Q(raw__has_key="named_by_gateway") & Q(external_id__startswith="gw-")
    traces = Trace.objects.filter(deployment_id=deployment_id, source=TraceSource.GATEWAY, forked_from__isnull=True)
    traces = traces.filter(marked | unmarked)
    if since is not None:
        traces = traces.filter(started_at__gte=since)
    rows = traces.order_by("started_at", "id").values_list("id", "external_id", "session_id", "raw__named_by_gateway")
    for trace_id, key, session_id, flag in rows.iterator():
        if flag is True or GENERATED_KEY.match(key):
            yield trace_id, key, stitch_scope(session_id=session_id, api_key_id=None)


def traces_stitch_plan(*, deployment_id: int, since: datetime | None = None) -> StitchPlan:
    plan = StitchPlan()
    tips: dict[str, list[_Conversation]] = {}

    def remember(conv: _Conversation, start: int, roles: list[str]) -> None:
        chain = history_chain(conv.digests, after=conv.scope)
        for i in range(start, len(conv.digests)):
            if roles[i] == "assistant":
                tips.setdefault(chain[i], []).append(conv)

    roles_of: dict[int, list[str]] = {}
    for trace_id, key, scope in _rows(deployment_id, since):
        plan.traces += 1
        rows = list(
            Message.objects.filter(trace_id=trace_id)
            .order_by("position")
            .values_list("id", "role", "content", "tool_calls", "tool_call_id", "name", "finish_reason")
        )
        visible = [r for r in rows if not (r[1] == "assistant" and r[6] in UNSEEN_FINISH_REASONS)]
        digests = [message_digest(r[1], r[2], r[3], r[4], r[5]) for r in visible]
        roles = [r[1] for r in visible]
        chain = history_chain(digests, after=scope)
        conv = None
        for k in range(len(digests) - 1, 0, -1):  # longest history that ends on an answer, short of the whole
            if roles[k - 1] == "assistant" and chain[k - 1] in tips:
                found = tips[chain[k - 1]]
                agreeing = [c for c in found if c.digests[k:] and c.digests[k:] == digests[k : len(c.digests)]]
                open_ = [c for c in found if not c.continued]
                conv = (agreeing or open_ or found)[-1]
                break
        if conv is None:
            new = _Conversation(trace_id, key, digests, [r[0] for r in visible], len(rows), scope)
            roles_of[trace_id] = roles
            remember(new, 0, roles)
            continue
        shared = next((i for i, (a, b) in enumerate(zip(conv.digests, digests, strict=False)) if a != b), None)
        if shared is not None:
            plan.forks.append(Fork(trace_id, key, conv.trace_id, conv.external_id, shared))
            new = _Conversation(trace_id, key, digests, [r[0] for r in visible], len(rows), scope)
            roles_of[trace_id] = roles
            remember(new, 0, roles)
            continue
        # The conversation's history is a prefix of this trace's, or the other way round.
        conv.continued = True
        n = len(conv.digests)
        same, moved, seen = {}, [], 0
        for row in rows:
            is_visible = not (row[1] == "assistant" and row[6] in UNSEEN_FINISH_REASONS)
            if is_visible and seen < n:
                same[row[0]] = conv.visible_ids[seen]
            elif seen >= n or not is_visible:
                moved.append((row[0], conv.count + len(moved)))
            seen += is_visible
        plan.merges.append(Merge(trace_id, key, conv.trace_id, conv.external_id, same, moved))
        if len(digests) > n:
            start = n
            conv.digests = conv.digests + digests[n:]
            conv.visible_ids = conv.visible_ids + [r[0] for r in visible[n:]]
            roles_of[conv.trace_id] = roles_of[conv.trace_id] + roles[n:]
            remember(conv, start, roles_of[conv.trace_id])
        conv.count += len(moved)
    return plan


def _repoint(model, source_id: int, target_id: int, same: dict[int, int], moved: list[int]) -> None:
    """Annotations of the source trace: on a repeated message, to the conversation's message;
    on a moved one, they follow it (only their trace changes)."""
    for old, new in same.items():
        model.objects.filter(message_id=old).update(message_id=new, trace_id=target_id)
    if moved:
        model.objects.filter(message_id__in=moved).update(trace_id=target_id)


# Sent inside the merge's transaction, before the source trace is deleted, with
# `source_id`, `target_id` and `same` (source message id -> conversation's message id), so
# rows of the apps above this one that point at traces (training items) follow the merge
# without this app importing them.
trace_merged = Signal()


@transaction.atomic
def traces_stitch_apply(*, plan: StitchPlan) -> None:
    """Carry out a plan made by `traces_stitch_plan` (on data that has not changed since)."""
    for fork in plan.forks:
        Trace.objects.filter(id=fork.trace_id).update(forked_from_id=fork.parent_id, forked_at=fork.at)
    touched: set[int] = set()
    for merge in plan.merges:
        source, target = merge.source_id, merge.target_id
        moved_ids = [m for m, _ in merge.moved]
        # A user's rating of a repeated turn the conversation's trace already has from them: keep that one.
        for old, new in merge.same.items():
            users = TurnRating.objects.filter(message_id=new).values_list("user_id", flat=True)
            TurnRating.objects.filter(message_id=old, user_id__in=list(users)).delete()
            if JudgeResult.objects.filter(message_id=new, is_latest=True).exists():
                JudgeResult.objects.filter(message_id=old, is_latest=True).update(is_latest=False)
        for model in (Comment, Correction, TurnRating, JudgeResult):
            _repoint(model, source, target, merge.same, moved_ids)
        for old, new in merge.same.items():
            CustomerFeedback.objects.filter(message_id=old).update(message_id=new, trace_id=target)
        CustomerFeedback.objects.filter(trace_id=source).update(trace_id=target)
        # The later part's grade of a name is the verdict on the whole conversation.
        Grade.objects.filter(trace_id=target, name__in=Grade.objects.filter(trace_id=source).values("name")).delete()
        Grade.objects.filter(trace_id=source).update(trace_id=target)
        trace_merged.send(sender=Trace, source_id=source, target_id=target, same=merge.same)
        FailureClusterMember.objects.filter(trace_id=source).update(trace_id=target)
        TraceFlag.objects.filter(
            trace_id=source, name__in=TraceFlag.objects.filter(trace_id=target).values("name")
        ).delete()
        TraceFlag.objects.filter(trace_id=source).update(trace_id=target)
        QueueItem.objects.filter(
            trace_id=source, queue_id__in=QueueItem.objects.filter(trace_id=target).values("queue_id")
        ).delete()
        QueueItem.objects.filter(trace_id=source).update(trace_id=target)
        Trace.objects.filter(forked_from_id=source).update(forked_from_id=target)
        for message_id, position in merge.moved:
            Message.objects.filter(id=message_id).update(trace_id=target, position=position)
        _absorb(target, source)
        Trace.objects.filter(id=source).delete()
        touched.add(target)
    for trace_id in sorted(touched):
        _recount(trace_id)
    trace_outcomes_refresh(trace_ids=sorted(touched))
    if touched:
        traces_search_index_later(trace_ids=sorted(touched))


def _absorb(target_id: int, source_id: int) -> None:
    """The conversation's trace takes the later trace's end, status and flags."""
    source = Trace.objects.get(id=source_id)
    target = Trace.objects.select_for_update().get(id=target_id)
    target.ended_at = max(filter(None, [target.ended_at, source.ended_at, source.started_at]), default=None)
    target.status = source.status  # the later call's outcome, as when a named trace is extended
    target.model_version_id = source.model_version_id or target.model_version_id
    target.tools = target.tools or source.tools
    ratings = [r for r in (target.feedback_rating, source.feedback_rating) if r is not None]
    target.feedback_rating = min(ratings) if ratings else None
    rewards = [r for r in (target.judge_reward, source.judge_reward) if r is not None]
    target.judge_reward = min(rewards) if rewards else None
    target.save(update_fields=["ended_at", "status", "model_version", "tools", "feedback_rating", "judge_reward"])


def _recount(trace_id: int) -> None:
    messages = [
        ParsedMessage(
            role=role,
            content=content,
            content_parts=None,
            name="",
            tool_calls=calls,
            tool_call_id="",
            raw={},
            serving={"usage": usage} if usage else {},
        )
        for role, content, calls, usage in Message.objects.filter(trace_id=trace_id)
        .order_by("position")
        .values_list("role", "content", "tool_calls", "usage")
    ]
    counts = trace_counts(messages)
    Trace.objects.filter(id=trace_id).update(
        **counts,
        has_comment=Comment.objects.filter(trace_id=trace_id).exists(),
        has_customer_feedback=CustomerFeedback.objects.filter(trace_id=trace_id).exists(),
    )
