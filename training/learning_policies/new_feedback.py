"""The new feedback a policy would learn from: what arrived that no run of it used."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Max

from feedback.models import Comment, CustomerFeedback, JudgeResult, Trace
from feedback.models.judge import JudgeStatus
from training.learning_policies.models import (
    LearningPolicy,
    LearningPolicyUse,
    PolicySignal,
    UseKind,
)
from training.services.episode_sets import episode_turn_items
from training.services.feedback_sets import MAX_TRACES, turn_items


@dataclass
class NewSignal:
    """What arrived for a policy that no run of it used: the rows by kind, the turns they
    are on, and when the newest came."""

    turns: int = 0
    newest: datetime | None = None
    what: str = "turns"
    ids: dict[str, set[int]] = field(default_factory=dict)


def _unused(policy: LearningPolicy, kind: str):
    return LearningPolicyUse.objects.filter(policy=policy, kind=kind).values("object_id")


def _signal_rows(policy: LearningPolicy):
    """(queryset of new rows, the use kind, what a unit is called, the field naming its turn)."""
    deployment = policy.deployment
    if policy.signal == PolicySignal.COMMENTS:
        rows = Comment.objects.filter(trace__deployment=deployment, message__role="assistant")
        return rows.exclude(pk__in=_unused(policy, UseKind.COMMENT)), UseKind.COMMENT, "commented turns", "message_id"
    if policy.signal == PolicySignal.CUSTOMER:
        rows = CustomerFeedback.objects.filter(deployment=deployment, message__role="assistant")
        return (
            rows.exclude(pk__in=_unused(policy, UseKind.CUSTOMER)),
            UseKind.CUSTOMER,
            "turns with customer feedback",
            "message_id",
        )
    if policy.signal == PolicySignal.JUDGE:
        rows = JudgeResult.objects.filter(trace__deployment=deployment, is_latest=True, status=JudgeStatus.SUCCEEDED)
        return rows.exclude(pk__in=_unused(policy, UseKind.JUDGE)), UseKind.JUDGE, "judged turns", "message_id"
    rows = Trace.objects.filter(deployment=deployment, environment=policy.environment, metadata__split="train")
    return rows.exclude(pk__in=_unused(policy, UseKind.EPISODE)), UseKind.EPISODE, "graded episodes", "id"


def new_signal(*, policy: LearningPolicy) -> NewSignal:
    """How much new feedback of the policy's signal there is (two aggregate queries)."""
    rows, _kind, what, turn = _signal_rows(policy)
    figures = rows.aggregate(newest=Max("created_at"))
    return NewSignal(turns=rows.values(turn).distinct().count(), newest=figures["newest"], what=what)


def _items_for(policy: LearningPolicy) -> tuple[list[dict[str, Any]], str, set[int]]:
    """The training items of the new feedback, its use kind, and the ids of the rows used.

    A turn is included when it carries at least one row of the signal no run used; its item
    is built as `training_set_from_feedback` builds it (with the turn's other feedback as
    context), and only the new rows are recorded as used."""
    rows, kind, _what, _turn = _signal_rows(policy)
    if kind == UseKind.EPISODE:
        new_traces = set(rows.values_list("pk", flat=True)[:MAX_TRACES])
        items = episode_turn_items(deployment=policy.deployment, environment=policy.environment, split="train")
        items = [it for it in items if it["trace_id"] in new_traces]
        return items, kind, {it["trace_id"] for it in items}
    new_ids = set(rows.values_list("pk", flat=True)[:MAX_TRACES])
    trace_ids = sorted(set(rows.filter(pk__in=new_ids).values_list("trace_id", flat=True)))
    key = {UseKind.COMMENT: "comments", UseKind.CUSTOMER: "customer_feedback", UseKind.JUDGE: "judge_result"}[kind]
    kept, used = [], set()
    for item in turn_items(trace_ids=trace_ids):
        found = item["provenance"][key]
        ids = set(found if isinstance(found, list) else [found] if found is not None else [])
        if ids & new_ids:
            kept.append(item)
            used |= ids & new_ids
    return kept, kind, used
