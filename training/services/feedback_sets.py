"""Training sets from what people and the judge said about traces.

For every assistant turn, in the selected traces, that carries a comment, a correction,
customer feedback or a judgement: the context up to it, the judge's rubric and the
logged response's reward, the corrected response (an operator's correction first, then
a customer's, then the judge's), the critique as text, and the ids of everything used."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from feedback.judge.scoring import BRACKET_CALL
from feedback.models import Comment, Correction, CustomerFeedback, JudgeResult, Message, QueueItem, Trace
from feedback.models.judge import JudgeStatus
from feedback.selectors.trace_list import traces_filtered
from feedback.selectors.traces import message_as_openai
from training.inference.codec import message_served_text
from training.models import CorrectionSource, TrainingItemKind, TrainingSet
from training.services.judge_gate import JudgeGateClosed, judge_gate_pass
from training.services.training_sets import TrainingSetError, training_set_create
from training.serving.models import Deployment

MAX_TRACES = 20_000


def training_set_from_feedback(
    *,
    name: str,
    filters: dict[str, Any] | None = None,
    queue_id: int | None = None,
    deployment=None,
    heldout_fraction: float = 0.2,
    description: str = "",
    user=None,
    judge_gate_override_reason: str = "",
) -> TrainingSet:
    """Build the next version of `name` from the traces the dashboard's filters select
    (cleaned `TraceFilterForm` values) or those of a saved annotation queue.

    Items that carry the judge's rubric, reward or written correction need the judge's
    training gate open for their deployments, or `judge_gate_override_reason` from `user`
    (audited); the gate as it stood is kept in the set's `selection`."""
    if (filters is None) == (queue_id is None):
        raise TrainingSetError([("source", "give either trace filters or a queue")])
    if queue_id is not None:
        traces = Trace.objects.filter(pk__in=QueueItem.objects.filter(queue_id=queue_id).values("trace_id"))
    else:
        traces = traces_filtered(filters or {})
    if deployment is not None:
        traces = traces.filter(deployment=deployment)
    trace_ids = list(traces.values_list("pk", flat=True)[:MAX_TRACES])
    items = turn_items(trace_ids=trace_ids)
    if not items:
        raise TrainingSetError([("source", "no assistant turn in the selected traces has feedback or a judgement")])
    selection = {"filters": json.loads(json.dumps(filters, default=str)) if filters is not None else None}
    selection |= {"queue": queue_id, "traces": len(trace_ids)}
    judged = [it for it in items if it["provenance"]["judge_result"] is not None]
    if judged:
        trace_deployments = dict(
            Trace.objects.filter(pk__in={it["trace_id"] for it in judged}).values_list("pk", "deployment")
        )
        deployments = Deployment.objects.filter(pk__in=set(trace_deployments.values())).order_by("name")
        try:
            selection["judge_gate"] = judge_gate_pass(
                deployments=list(deployments),
                uses="a training set with the judge's rubrics, rewards or corrections",
                override_reason=judge_gate_override_reason,
                user=user,
            )
        except JudgeGateClosed as exc:
            raise TrainingSetError([(exc.field, exc.reason)]) from None
    return training_set_create(
        name=name,
        items=items,
        deployment=deployment,
        selection=selection,
        description=description,
        heldout_fraction=heldout_fraction,
        user=user,
    )


def turn_items(*, trace_ids: list[int]) -> list[dict[str, Any]]:
    """One item per assistant turn with feedback, in a fixed number of queries."""
    by_turn: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    comments = Comment.objects.filter(trace_id__in=trace_ids, message__role="assistant").select_related("author")
    for c in comments.order_by("id"):
        by_turn[c.message_id]["comments"].append(c)
    for c in Correction.objects.filter(trace_id__in=trace_ids, message__role="assistant").order_by("id"):
        by_turn[c.message_id]["corrections"].append(c)
    customer = CustomerFeedback.objects.filter(trace_id__in=trace_ids, message__role="assistant").order_by("id")
    for f in customer:
        by_turn[f.message_id]["customer"].append(f)
    judged = JudgeResult.objects.filter(trace_id__in=trace_ids, is_latest=True, status=JudgeStatus.SUCCEEDED)
    for r in judged:
        by_turn[r.message_id]["judge"].append(r)
    if not by_turn:
        return []
    turns = {m.pk: m for m in Message.objects.filter(pk__in=list(by_turn)).select_related("trace")}
    needed: dict[int, int] = {}
    for m in turns.values():
        needed[m.trace_id] = max(needed.get(m.trace_id, -1), m.position)
    history: dict[int, list[Message]] = defaultdict(list)
    for m in Message.objects.filter(trace_id__in=list(needed)).order_by("trace_id", "position"):
        if m.position <= needed[m.trace_id]:
            history[m.trace_id].append(m)

    items = []
    for message_id, found in by_turn.items():
        turn = turns[message_id]
        trace = turn.trace
        judge = found["judge"][0] if found["judge"] else None
        corrected, source = "", CorrectionSource.NONE
        # A correction may be a tool call with no words: it is the turn written as the model
        # writes it (the served text), or an operator's corrected action would be lost.
        human = [text for c in found["corrections"] if (text := message_served_text(c.as_openai()))]
        # A customer's correction is free text from a public link: one that holds a tool call
        # would train the agent to make a call no check ever saw, so it trains nothing.
        customer_corrections = [f for f in found["customer"] if f.correction and "<tool_call" not in f.correction]
        if human:
            corrected, source = human[-1], CorrectionSource.HUMAN
        elif customer_corrections:
            corrected, source = customer_corrections[-1].correction, CorrectionSource.CUSTOMER
        elif judge and judge.corrected_response and not BRACKET_CALL.search(judge.corrected_response):
            # A judge-turn/v1 correction of a call is "[calls tool …]" text: no agent emits it.
            corrected, source = judge.corrected_response, CorrectionSource.JUDGE
        critique = [c.body for c in found["comments"]] + [f.comment for f in found["customer"] if f.comment]
        items.append(
            {
                "kind": TrainingItemKind.TURN,
                "key": f"turn:{trace.deployment_id}:{trace.external_id}:{turn.position}",
                "messages": [message_as_openai(m) for m in history[trace.pk] if m.position < turn.position],
                "tools": trace.tools or None,
                "rubric": judge.rubric if judge else None,
                "feedback": "\n".join(critique),
                "logged_response": message_as_openai(turn),
                "reward": judge.reward if judge else None,
                "corrected_response": corrected,
                "correction_source": source,
                "trace_id": trace.pk,
                "message_id": turn.pk,
                "provenance": {
                    "comments": [c.pk for c in found["comments"]],
                    # Whose words they are (a scripted reviewer's account says so in its name).
                    "comment_authors": sorted({c.author.username for c in found["comments"] if c.author}),
                    "corrections": [c.pk for c in found["corrections"]],
                    "customer_feedback": [f.pk for f in found["customer"]],
                    "judge_result": judge.pk if judge else None,
                    "judge_model": judge.judge_model if judge else "",
                },
            }
        )
    # Turns whose context is empty (an assistant message first) cannot be replayed.
    return [it for it in sorted(items, key=lambda it: it["key"]) if it["messages"]]
