"""Recording environment episodes as traces, so that the episodes a job trains and
evaluates on are browsable, commentable and judgeable in the dashboard like production
traffic. Imports no ML library: the worker calls it from the training loop's hooks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from feedback.models import TraceSource, TraceStatus
from feedback.services.ingest import ItemResult, traces_ingest
from training.environments.episodes import Episode
from training.serving.models import Deployment


def episode_trace_item(
    episode: Episode,
    *,
    environment: str,
    model_version: str,
    job_id: int | None,
    step: int,
    phase: str,
    index: int,
) -> dict[str, Any]:
    """One episode in the ingest format. The G episodes of a task at one step share a
    session; the metadata holds the environment, task, model version, reward and reason, and
    the environment's grade is the trace's `outcome` grade (a success at full reward, as the
    job's success rate counts it)."""
    run = f"job{job_id}" if job_id is not None else "run"
    metadata = episode.metadata(environment) | {
        "model_version": model_version,
        "training_job": job_id,
        "step": step,
        "phase": phase,
        "episode_index": index,
    }
    messages = []
    for m in episode.messages:
        message = {k: v for k, v in m.items() if v is not None or k == "content"}
        if message.get("role") == "assistant" and message.get("tool_calls") and not message.get("content"):
            message["content"] = None
        messages.append(message)
    return {
        "external_id": f"{environment}:{run}:{phase}-step{step}:{episode.task.id}:{index}",
        "session_id": f"{environment}:{run}:{phase}-step{step}:{episode.task.id}",
        "environment": environment,
        "model": model_version,
        "tools": episode.task.tools,
        "messages": messages,
        "metadata": metadata,
        "status": TraceStatus.OK,
        "grades": [
            {
                "outcome": "success" if episode.grade.reward >= 1.0 - 1e-9 else "failure",
                "score": episode.grade.reward,
                "reason": episode.grade.reason[:20_000],
                "source": environment[:100],
            }
        ],
    }


def episodes_record(
    *,
    deployment: Deployment,
    environment: str,
    episodes: Sequence[Episode],
    model_version: str,
    job_id: int | None,
    step: int,
    phase: str,
) -> list[ItemResult]:
    """Store `episodes` as traces of `deployment` (source "orchestrator"). Idempotent:
    a resumed job that replays a step stores nothing twice."""
    items = [
        episode_trace_item(
            e, environment=environment, model_version=model_version, job_id=job_id, step=step, phase=phase, index=i
        )
        for i, e in enumerate(episodes)
    ]
    return traces_ingest(deployment=deployment, items=items, source=TraceSource.ORCHESTRATOR)
