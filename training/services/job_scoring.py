"""How a training job's candidates are scored: each item's grader, else the judge under the
item's rubric, and for episodes the judge over each episode's transcript; every judge call is
stored (`CandidateScoring`) with the job's id. Worker side, like `job_runner`."""

from __future__ import annotations

from feedback.judge.client import JudgeCallFailed
from feedback.judge.scoring import score_candidates
from feedback.models import ScoringPurpose
from feedback.selectors.judge import judge_endpoint_for
from feedback.services.judge_gate import candidate_scoring_record
from training.trainer.items import TurnItem, grader_scorer


def scorer_for(items: list[TurnItem], *, deployment=None, job_id: int | None = None):
    """Each item's grader when it has one; else the judge under the item's rubric (the
    deployment's own judge endpoint when it has one). Every judge call is stored
    (`CandidateScoring`, with `job_id`)."""
    graded = grader_scorer()
    judge = None

    def score(item: TurnItem, candidates: list[str]) -> list[float]:
        nonlocal judge
        if item.grader:
            return graded(item, candidates)
        if judge is None:
            judge = _judge_scorer(deployment, job_id)
        return judge(item, candidates)

    return score


def _scored_and_stored(endpoint, deployment, job_id: int | None, key: str, context, rubric, candidates, tools):
    """One `score_candidates` call, stored like a judgement whether it succeeds or fails."""
    common = {
        "purpose": ScoringPurpose.TRAINING,
        "endpoint": endpoint,
        "rubric": rubric,
        "candidates": len(candidates),
        "deployment": deployment,
        "training_job_id": job_id,
        "item_key": key,
    }
    try:
        scores = score_candidates(context, rubric, candidates, endpoint=endpoint, tools=tools or ())
    except JudgeCallFailed as exc:
        candidate_scoring_record(failure=exc, **common)
        raise
    candidate_scoring_record(scores=scores, **common)
    return [float(s) for s in scores]


def _judge_scorer(deployment, job_id: int | None = None):
    endpoint = judge_endpoint_for(deployment=deployment)

    def score(item: TurnItem, candidates: list[str]) -> list[float]:
        return _scored_and_stored(
            endpoint, deployment, job_id, item.id, item.messages, item.rubric, candidates, item.tools
        )

    return score


def episode_judge(deployment, rubric: str, job_id: int | None = None):
    """The judge scores the G episodes of a task side by side, each as its transcript."""
    endpoint = judge_endpoint_for(deployment=deployment)

    def judge(task, episodes: list) -> list[float]:
        candidates = [_transcript(e.messages[len(task.first_messages()) :]) for e in episodes]
        key = str(getattr(task, "id", "") or "")
        return _scored_and_stored(
            endpoint, deployment, job_id, key, task.first_messages(), rubric, candidates, task.tools
        )

    return judge


def _transcript(messages: list[dict]) -> str:
    lines = []
    for m in messages:
        if m.get("role") == "assistant":
            calls = " ".join(
                f"{c['function']['name']}({c['function'].get('arguments', '')})" for c in m.get("tool_calls") or []
            )
            lines.append(f"assistant: {m.get('content') or ''} {calls}".strip())
        else:
            lines.append(f"{m.get('role')}: {m.get('content') or ''}")
    return "\n".join(lines)
