"""Judging turns and storing the results: on a new comment or customer feedback, or by
hand (backfill batches are in `judge_jobs`); plus order-swap checks of the judge.

`judge_request` creates a pending `JudgeResult` and enqueues its task after commit;
`judge_run` (what the task calls) builds the prompt from the turn and all the feedback
on it, calls the judge, and stores the outcome — succeeded with rubric, reward,
rationale and correction, or failed with the reason. A failure never writes a reward.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Min, Q
from django.dispatch import Signal
from django.utils import timezone

from feedback.judge.client import JudgeCallFailed, JudgeEndpoint, JudgeNotConfigured
from feedback.judge.prompts import CURRENT_ACTION, CURRENT_SCORE, CURRENT_TURN, FeedbackItem
from feedback.judge.scoring import judge_turn, order_swap_check
from feedback.models import (
    Comment,
    Correction,
    CustomerFeedback,
    DeploymentJudge,
    JudgeJob,
    JudgeResult,
    JudgeStatus,
    JudgeTrigger,
    Message,
    MessageRole,
    OrderSwapCheck,
    RatingKind,
    Trace,
)
from feedback.selectors.judge import judge_endpoint_for, judge_is_configured
from feedback.selectors.policy_notes import policy_note_item, policy_notes_approved
from feedback.selectors.traces import message_as_openai
from feedback.tasks import judge_result_run_task, order_swap_check_task
from training.inference.codec import message_served_text
from training.serving.models import Deployment
from webapp.kernel.stale_work import stale_work_fail
from webapp.kernel.work import work_claim, work_end, work_worker_name

logger = logging.getLogger(__name__)

RAW_OUTPUT_MAX = 50_000


class JudgeError(ValueError):
    """A judging request that cannot be made; the message says why."""


def _rating_text(kind: str, value: int | None) -> str:
    if value is None:
        return ""
    if kind == RatingKind.THUMBS:
        return "thumbs up" if value > 0 else "thumbs down"
    return f"{value} out of 5"


def feedback_items_for(
    *, message: Message, calls: str = CURRENT_TURN.calls
) -> tuple[list[FeedbackItem], list[Comment], list[CustomerFeedback], list[Correction]]:
    """Everything people said about the turn, as the judge is shown it, and the rows it
    came from. Operators' own turn ratings are left out on purpose: they are the labels
    the judge's agreement is measured against, and showing them would inflate it.
    An operator's corrected calls are shown as the judge's prompt shows calls (`calls`)."""
    comments = list(Comment.objects.filter(message=message).order_by("created_at", "id"))
    last_assistant = (
        Message.objects.filter(trace_id=message.trace_id, role=MessageRole.ASSISTANT).order_by("-position").first()
    )
    feedback_q = Q(message=message)
    if last_assistant is not None and last_assistant.pk == message.pk:
        # Feedback on the whole trace is about the answer the customer finally got.
        feedback_q |= Q(trace_id=message.trace_id, message__isnull=True)
    customer = list(CustomerFeedback.objects.filter(feedback_q).order_by("created_at", "id"))
    corrections = list(Correction.objects.filter(message=message).order_by("created_at", "id"))

    items: list[FeedbackItem] = []
    for c in comments:
        text = f'{c.body} (about the quoted text: "{c.quote}")' if c.quote else c.body
        items.append(FeedbackItem(kind="operator comment", text=text))
    for f in customer:
        rating = _rating_text(f.rating_kind, f.rating)
        if f.comment or rating:
            items.append(FeedbackItem(kind="customer feedback", text=f.comment or "(no text)", rating=rating))
        if f.correction:
            items.append(FeedbackItem(kind="customer's correction", text=f.correction))
    for c in corrections:
        if calls == "served":
            text = message_served_text(c.as_openai())
        else:
            text = c.content
            for call in c.tool_calls or []:
                fn = call.get("function") or {}
                text += f" [calls tool {fn.get('name')} with {fn.get('arguments')}]"
        if c.note:
            text += f" (why: {c.note})"
        items.append(FeedbackItem(kind="operator's corrected response", text=text.strip()))
    return items, comments, customer, corrections


def _context_for(message: Message) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    earlier = Message.objects.filter(trace_id=message.trace_id, position__lt=message.position).order_by("position")
    return [message_as_openai(m) for m in earlier], message_as_openai(message)


def judge_request(
    *,
    message: Message,
    trigger: str,
    requested_by=None,
    job: JudgeJob | None = None,
    enqueue: bool = True,
) -> JudgeResult:
    """A pending judgement of `message`, run by a worker after commit. A turn that
    already has a pending judgement is not queued twice: that one will see all feedback
    present when it runs."""
    if message.role != MessageRole.ASSISTANT:
        raise JudgeError(f"only assistant turns are judged; message {message.position} is a {message.role} message")
    if job is None:
        pending = JudgeResult.objects.filter(message=message, status=JudgeStatus.PENDING, job__isnull=True).first()
        if pending is not None:
            return pending
    result = JudgeResult.objects.create(
        trace_id=message.trace_id, message=message, trigger=trigger, requested_by=requested_by, job=job
    )
    if enqueue:
        judge_result_run_task.delay_on_commit(result.pk)
    return result


def judge_on_comment(*, comment: Comment) -> JudgeResult | None:
    """Called when an operator comments: judge the turn if a judge is configured and
    automatic judging is on, and the comment is on an assistant turn."""
    if not settings.JUDGE_AUTO or comment.message.role != MessageRole.ASSISTANT:
        return None
    if not judge_is_configured(deployment=comment.trace.deployment):
        return None
    return judge_request(message=comment.message, trigger=JudgeTrigger.COMMENT, requested_by=comment.author)


def _feedback_turn(feedback: CustomerFeedback) -> Message | None:
    if feedback.message_id is not None:
        return feedback.message if feedback.message.role == MessageRole.ASSISTANT else None
    return Message.objects.filter(trace_id=feedback.trace_id, role=MessageRole.ASSISTANT).order_by("-position").first()


def judge_on_customer_feedback(*, feedback: CustomerFeedback) -> JudgeResult | None:
    """Called when customer feedback arrives. Judged when it says something: a comment,
    a correction, or a negative rating (a bare thumbs-up teaches the judge little)."""
    if not settings.JUDGE_AUTO:
        return None
    negative = feedback.sentiment is not None and feedback.sentiment < 0
    if not (feedback.comment.strip() or feedback.correction.strip() or negative):
        return None
    if not judge_is_configured(deployment=feedback.trace.deployment):
        return None
    turn = _feedback_turn(feedback)
    if turn is None:
        return None
    return judge_request(message=turn, trigger=JudgeTrigger.CUSTOMER_FEEDBACK)


def _update_trace_reward(trace_id: int) -> None:
    lowest = JudgeResult.objects.filter(trace_id=trace_id, is_latest=True).aggregate(m=Min("reward"))["m"]
    Trace.objects.filter(pk=trace_id).update(judge_reward=lowest)


def judgement_silent_after() -> float:
    """Seconds after which a judgement still held has outlived any call (the call's deadline,
    plus a grace for storing it): its worker died or hung."""
    return settings.JUDGE_DEADLINE_S + settings.JUDGE_STALE_GRACE_S


def judge_run(*, result: JudgeResult, endpoint: JudgeEndpoint | None = None, worker: str | None = None) -> JudgeResult:
    """Run a pending judgement and store its outcome. A result already finished, or
    running elsewhere (a redelivered task), is returned as it is. Whatever goes wrong
    while it runs (the judge, the data, a bug) marks it failed with the reason: it is
    never left `running`."""
    worker = worker or work_worker_name()
    # A judgement left running by a worker that died is taken over once it has been silent
    # for longer than a call can take; a live one is left to finish.
    claimed = work_claim(JudgeResult, pk=result.pk, worker=worker, resume_after=judgement_silent_after())
    result.refresh_from_db()
    if claimed is None:
        return result
    try:
        return _judge_claimed(result, endpoint)
    except Exception as exc:
        logger.exception("judgement %s of message %s failed unexpectedly", result.pk, result.message_id)
        reason = f"the judgement could not be completed: {type(exc).__name__}: {exc}"[:5000]
        # Only the outcome is written: no reward, and nothing half-set by the failed run.
        work_end(JudgeResult, pk=result.pk, worker=worker, status=JudgeStatus.FAILED, error=reason)
        result.refresh_from_db()
        return result


# What a finished run writes besides the status, the error and `finished_at` (`work_end`'s);
# everything else on the row is left as it is.
_OUTCOME_FIELDS = (
    "judge_model",
    "judge_base_url",
    "prompt_version",
    "served_model",
    "call_attempts",
    "latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "cost",
    "rubric",
    "reward",
    "rationale",
    "corrected_response",
    "action",
    "guard_reason",
    "raw_output",
)


def _finish(result: JudgeResult, *, latest: bool) -> bool:
    """Write the run's outcome if this worker still holds the judgement; False (and the
    row reloaded as it stands) when the sweep or another worker got there first."""
    written = False

    def settle(row: JudgeResult) -> tuple[str, ...]:
        for name in _OUTCOME_FIELDS:
            setattr(row, name, getattr(result, name))
        return _OUTCOME_FIELDS

    def on_end(row: JudgeResult) -> None:
        # Under the row's lock, in the transaction that ends it: the sweep waits.
        nonlocal written
        written = True
        if latest:
            JudgeResult.objects.filter(message_id=row.message_id, is_latest=True).update(is_latest=False)
            JudgeResult.objects.filter(pk=row.pk).update(is_latest=True)
            _update_trace_reward(row.trace_id)
            if _wants_swap_check(row):
                order_swap_check_task.delay_on_commit(row.pk)

    work_end(
        JudgeResult,
        pk=result.pk,
        worker=result.worker,
        status=result.status,
        error=result.error,
        settle=settle,
        on_end=on_end,
    )
    if not written:
        logger.warning(
            "judgement %s of message %s: a late %s outcome is dropped, the judgement was no longer this worker's",
            result.pk,
            result.message_id,
            result.status,
        )
    result.refresh_from_db()
    return written


def judge_results_fail_stale(*, now=None) -> list[int]:
    """Fail every judgement still held long after any call could have ended (its worker died
    or hung), through the shared sweep; the periodic sweep calls this. Returns their ids."""
    return stale_work_fail(
        JudgeResult,
        silent_after=judgement_silent_after(),
        now=now or timezone.now(),
        what="judgement's worker",
        on_failed=lambda result: logger.warning("judgement %s: %s", result.pk, result.error),
    )


def _judge_claimed(result: JudgeResult, endpoint: JudgeEndpoint | None) -> JudgeResult:
    message = Message.objects.select_related("trace__deployment").get(pk=result.message_id)
    try:
        endpoint = endpoint or judge_endpoint_for(deployment=message.trace.deployment)
    except JudgeNotConfigured as exc:
        return _fail(result, str(exc))

    items, comments, customer, corrections = feedback_items_for(message=message)
    result.comments.set(comments)
    result.customer_feedback.set(customer)
    result.human_corrections.set(corrections)
    context, turn = _context_for(message)
    result.judge_model = endpoint.model
    result.judge_base_url = endpoint.base_url
    result.prompt_version = CURRENT_ACTION.version if endpoint.correction_mode == "actions" else CURRENT_TURN.version
    if not items:
        return _fail(result, "no feedback on this turn to judge it by")
    # Approved policy notes join the turn's feedback, so the rubric the judge writes
    # carries the deployment's rules; a note nobody approved is never read.
    notes = policy_notes_approved(deployment=message.trace.deployment)
    result.policy_notes.set(notes)
    items = [*items, *(policy_note_item(v) for v in notes)]
    try:
        outcome = judge_turn(context=context, turn=turn, feedback=items, tools=message.trace.tools, endpoint=endpoint)
    except JudgeCallFailed as exc:
        _record(result, exc.record)
        result.raw_output = (exc.record.attempts[-1].raw if exc.record.attempts else "")[:RAW_OUTPUT_MAX]
        return _fail(result, exc.reason)

    _record(result, outcome.record)
    judgement = outcome.judgement
    result.served_model = outcome.record.served_model
    result.rubric = judgement.rubric.as_dict()
    result.reward = outcome.reward
    result.rationale = judgement.rationale
    result.corrected_response = judgement.corrected_response or ""
    result.action = outcome.action
    result.guard_reason = outcome.guard_reason or ""
    result.raw_output = outcome.raw[:RAW_OUTPUT_MAX]
    result.status = JudgeStatus.SUCCEEDED
    _finish(result, latest=True)
    return result


def _record(result: JudgeResult, record) -> None:
    result.call_attempts = record.attempts_as_dicts()
    result.latency_ms = record.latency_ms
    result.prompt_tokens = record.prompt_tokens
    result.completion_tokens = record.completion_tokens
    result.cost = record.cost
    result.served_model = record.served_model


def _fail(result: JudgeResult, reason: str) -> JudgeResult:
    result.status = JudgeStatus.FAILED
    result.error = reason[:5000]
    if _finish(result, latest=False):
        logger.warning("judgement %s of message %s failed: %s", result.pk, result.message_id, reason)
    return result


def _swap_candidates(result: JudgeResult) -> list[str] | None:
    """The logged turn and a correction (the judge's, else an operator's), as texts: a turn
    that is a tool call is compared as the model wrote it, not as its (empty) words."""
    logged = message_served_text(message_as_openai(result.message))
    correction = result.corrected_response
    if not correction:
        served = (message_served_text(c.as_openai()) for c in result.human_corrections.all())
        correction = next((text for text in served if text.strip()), "")
    if not logged.strip() or not correction.strip() or logged.strip() == correction.strip():
        return None
    return [logged, correction]


def _wants_swap_check(result: JudgeResult) -> bool:
    rate = settings.JUDGE_SWAP_CHECK_RATE
    return rate > 0 and random.random() < rate and _swap_candidates(result) is not None


def order_swap_check_run(
    *, result: JudgeResult, endpoint: JudgeEndpoint | None = None, rng: random.Random | None = None
) -> OrderSwapCheck | None:
    """Score the logged turn and its correction under the judgement's rubric in both
    orders and store how consistent the judge was. None when there is nothing to compare."""
    candidates = _swap_candidates(result)
    if candidates is None or not result.rubric:
        return None
    message = Message.objects.select_related("trace__deployment").get(pk=result.message_id)
    endpoint = endpoint or judge_endpoint_for(deployment=message.trace.deployment)
    context, _ = _context_for(message)
    check = OrderSwapCheck(
        result=result,
        judge_model=endpoint.model,
        judge_base_url=endpoint.base_url,
        prompt_version=CURRENT_SCORE.version,
    )
    try:
        swap = order_swap_check(
            context, result.rubric, candidates, endpoint=endpoint, tools=message.trace.tools, rng=rng
        )
    except JudgeCallFailed as exc:
        check.status = JudgeStatus.FAILED
        check.failure_reason = exc.reason[:5000]
        check.latency_ms = exc.record.latency_ms
        check.cost = exc.record.cost
        check.save()
        return check
    check.status = JudgeStatus.SUCCEEDED
    check.first_order = swap.first.presented
    check.first_scores = swap.first.scores
    check.second_scores = swap.second.scores
    check.pair_agreement = swap.pair_agreement
    check.mean_abs_diff = swap.mean_abs_diff
    records = [r for r in (swap.first.record, swap.second.record) if r is not None]
    check.latency_ms = sum(r.latency_ms for r in records)
    costs = [r.cost for r in records if r.cost is not None]
    check.cost = sum(costs) if costs else None
    check.save()
    return check


# Sent by `deployment_judge_set` with `judge` and `changes` ({field: [before, after]},
# empty for a save that changed nothing; `created`), so the append-only audit log of the
# apps above this one records who changed a deployment's judge without this app importing it.
deployment_judge_changed = Signal()

_AUDITED_FIELDS = ("base_url", "model", "api_key_env", "schema_mode", "correction_mode")


@transaction.atomic
def deployment_judge_set(
    *,
    deployment: Deployment,
    base_url: str,
    model: str,
    api_key_env: str = "",
    schema_mode: str = "full",
    correction_mode: str = "text",
) -> DeploymentJudge:
    """Give `deployment` its own judge endpoint (or change it). The key is never stored:
    `api_key_env` names the variable that holds it, and only judge key variables are
    accepted (`judge_key_env_check`); a bad value raises ValidationError naming the field.
    `correction_mode` "actions" has the judge choose the corrected turn among the agent's
    actions instead of writing it."""
    judge = DeploymentJudge.objects.filter(deployment=deployment).first() or DeploymentJudge(deployment=deployment)
    created = judge._state.adding
    before = {f: getattr(judge, f) for f in _AUDITED_FIELDS}
    judge.base_url, judge.model, judge.api_key_env, judge.schema_mode = base_url, model, api_key_env, schema_mode
    judge.correction_mode = correction_mode
    judge.updated_at = timezone.now()
    judge.full_clean()
    judge.save()
    changes = {f: [before[f], getattr(judge, f)] for f in _AUDITED_FIELDS if created or before[f] != getattr(judge, f)}
    deployment_judge_changed.send(sender=DeploymentJudge, judge=judge, changes=changes, created=created)
    return judge
