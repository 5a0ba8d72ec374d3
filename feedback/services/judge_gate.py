"""The training gate's evidence: each `score_candidates` call stored (`CandidateScoring`),
and calibration runs that score operators' rated turns with the prompt training uses.

GRPO rewards come from `score_candidates` (prompt `score-candidates/…`): the judge sees the
context, a rubric and the candidates, never the feedback. Whether that judge can be trusted
is therefore measured the same way: `judge_calibration_run` scores each rated turn's logged
response under its rubric, feedback left out, and `feedback.selectors.judge_gate` compares
the scores with the operators' ratings.
"""

from __future__ import annotations

import random
from typing import Any

from django.conf import settings

from feedback.judge.client import JudgeCallFailed, JudgeEndpoint
from feedback.judge.prompts import CURRENT_SCORE
from feedback.judge.scoring import CandidateScores, score_candidates
from feedback.models import CandidateScoring, JudgeResult, JudgeStatus, Message, OrderSwapCheck, ScoringPurpose
from feedback.selectors.judge import human_labels, judge_endpoint_for
from feedback.selectors.traces import message_as_openai
from feedback.services.judging import order_swap_check_run
from training.serving.models import Deployment

RAW_OUTPUT_MAX = 50_000


def candidate_scoring_record(
    *,
    purpose: str,
    endpoint: JudgeEndpoint,
    rubric: Any,
    candidates: int,
    scores: CandidateScores | None = None,
    failure: JudgeCallFailed | None = None,
    deployment: Deployment | None = None,
    training_job_id: int | None = None,
    step: int | None = None,
    item_key: str = "",
    message: Message | None = None,
) -> CandidateScoring:
    """Store one `score_candidates` call, succeeded (`scores`) or failed (`failure`)."""
    record = scores.record if scores is not None else (failure.record if failure is not None else None)
    row = CandidateScoring(
        purpose=purpose,
        deployment=deployment,
        training_job_id=training_job_id,
        step=step,
        item_key=item_key[:300],
        message=message,
        status=JudgeStatus.SUCCEEDED if failure is None else JudgeStatus.FAILED,
        failure_reason=failure.reason[:5000] if failure is not None else "",
        judge_model=endpoint.model,
        judge_base_url=endpoint.base_url,
        prompt_version=scores.prompt_version if scores is not None else CURRENT_SCORE.version,
        rubric=rubric if isinstance(rubric, (dict, list)) else {"text": str(rubric)},
        candidates=candidates,
        scores=list(scores.scores) if scores is not None else [],
        presented=list(scores.presented) if scores is not None else [],
    )
    if scores is not None:
        row.raw_output = scores.raw[:RAW_OUTPUT_MAX]
    elif record is not None and record.attempts:
        row.raw_output = record.attempts[-1].raw[:RAW_OUTPUT_MAX]
    if record is not None:
        row.served_model = record.served_model
        row.attempts = record.attempts_as_dicts()
        row.latency_ms = record.latency_ms
        row.prompt_tokens = record.prompt_tokens
        row.completion_tokens = record.completion_tokens
        row.cost = record.cost
    row.save()
    return row


def judge_calibration_run(
    *,
    deployment: Deployment,
    endpoint: JudgeEndpoint | None = None,
    limit: int = 500,
    swap_checks: bool = True,
    rng: random.Random | None = None,
) -> dict[str, int]:
    """Score the deployment's rated assistant turns (not yet scored by this judge model and
    prompt version) with `score_candidates`, each logged response alone under its rubric
    (the latest judgement's, else PRACTICUM_JUDGE_CALIBRATION_RUBRIC), feedback left out.
    With `swap_checks`, rated turns with a judgement and a correction also get an
    order-swap check. Every call is stored; returns counts."""
    endpoint = endpoint or judge_endpoint_for(deployment=deployment)
    rng = rng or random.Random()
    labels = human_labels(deployment=deployment)
    done = set(
        CandidateScoring.objects.filter(
            purpose=ScoringPurpose.CALIBRATION,
            deployment=deployment,
            judge_model=endpoint.model,
            judge_base_url=endpoint.base_url,
            prompt_version=CURRENT_SCORE.version,
            status=JudgeStatus.SUCCEEDED,
        ).values_list("message_id", flat=True)
    )
    todo = [m for m, label in labels.items() if label.passed is not None and m not in done][:limit]
    judgements = {
        r.message_id: r
        for r in JudgeResult.objects.filter(message_id__in=todo, is_latest=True, status=JudgeStatus.SUCCEEDED)
    }
    counts = {"scored": 0, "failed": 0, "swap_checks": 0}
    for message in Message.objects.filter(pk__in=todo).select_related("trace").order_by("id"):
        earlier = Message.objects.filter(trace_id=message.trace_id, position__lt=message.position).order_by("position")
        context = [message_as_openai(m) for m in earlier]
        judged = judgements.get(message.pk)
        rubric = judged.rubric if judged is not None and judged.rubric else settings.JUDGE_CALIBRATION_RUBRIC
        common = {
            "purpose": ScoringPurpose.CALIBRATION,
            "endpoint": endpoint,
            "rubric": rubric,
            "candidates": 1,
            "deployment": deployment,
            "message": message,
        }
        try:
            scores = score_candidates(
                context,
                rubric,
                [message_as_openai(message)],
                endpoint=endpoint,
                tools=message.trace.tools or (),
                rng=rng,
            )
        except JudgeCallFailed as exc:
            candidate_scoring_record(failure=exc, **common)
            counts["failed"] += 1
            continue
        candidate_scoring_record(scores=scores, **common)
        counts["scored"] += 1
        if swap_checks and judged is not None:
            checked = OrderSwapCheck.objects.filter(
                result=judged,
                judge_model=endpoint.model,
                judge_base_url=endpoint.base_url,
                prompt_version=CURRENT_SCORE.version,
            ).exists()
            if not checked and order_swap_check_run(result=judged, endpoint=endpoint, rng=rng) is not None:
                counts["swap_checks"] += 1
    return counts
