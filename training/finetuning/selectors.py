"""Reads of the fine-tuning API: a job's events and status in OpenAI's words, and the
metrics of its checkpoint, from what the training job logged."""

from __future__ import annotations

import math
from typing import Any

from training.finetuning.lines import FineTuningError
from training.finetuning.models import FineTuningJob
from training.models import JobEventKind, TrainingJob, TrainingJobEvent
from training.services.jobs import training_job_awaits_set
from webapp.kernel.ids import parse_id


def job_events(*, ft: FineTuningJob, after: str | None = None, limit: int = 20) -> list[TrainingJobEvent]:
    """The job's events, newest first (OpenAI's order), without the sample rollouts."""
    events = TrainingJobEvent.objects.filter(job_id=ft.job_id).exclude(kind=JobEventKind.SAMPLE).order_by("-id")
    if after:
        before = parse_id(after.removeprefix("ftevent-"))
        if before is None:
            raise FineTuningError([("after", "must be an event id from this list")])
        events = events.filter(id__lt=before)
    return list(events[: limit + 1])


def event_message(event: TrainingJobEvent, total: int) -> tuple[str, str, str]:
    """(level, type, message) of an event, in the words OpenAI's events use."""
    data = event.data or {}
    if event.kind in (JobEventKind.STEP, JobEventKind.EVAL):
        shown = ", ".join(f"{k}={v:.4g}" for k, v in data.items() if isinstance(v, float | int) and k != "step")
        if event.kind == JobEventKind.STEP:
            return "info", "metrics", f"Step {event.step}/{total}: {shown}"
        return "info", "metrics", f"Evaluation at step {event.step}: {shown}"
    if event.kind == JobEventKind.BREACH:
        return "warn", "message", f"A monitor fired at step {event.step}: {data.get('message') or data}"
    message = str(data.get("message") or "")
    level = "error" if message.startswith(("failed", "error")) else "info"
    return level, "message", message


def job_status(job: TrainingJob) -> str:
    """Practicum's job status in OpenAI's words (`validating_files` while a worker builds its
    training set from the files)."""
    if training_job_awaits_set(job):
        return "validating_files"
    return {
        "queued": "queued",
        "running": "running",
        "cancelling": "running",
        "cancelled": "cancelled",
        "finished": "succeeded",
        "stopped": "failed",
        "failed": "failed",
    }.get(job.status, job.status)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def checkpoint_metrics(job: TrainingJob) -> dict[str, float]:
    """OpenAI's checkpoint `metrics` for the job's candidate, from the events it logged: the
    step and the training loss at that step (`train_loss`; a GRPO job's is its surrogate
    loss). Practicum's own beside them: the step's logged figures under their own names,
    its mean reward (`train_mean_reward`) and the latest evaluation's on held-out lines
    (`valid_mean_reward`), where logged.
    SFT jobs here log no validation loss, so `valid_loss` is left out."""
    logged = TrainingJobEvent.objects.filter(job=job, step__lte=job.step).order_by("-step", "-id")
    step = logged.filter(kind=JobEventKind.STEP).values_list("data", flat=True).first() or {}
    # The step's own figures stay beside OpenAI's names (loss, grad_norm, …), as before.
    out: dict[str, float] = {k: v for k, v in step.items() if _finite(v)}
    out["step"] = float(job.step)
    if _finite(step.get("loss")):
        out["train_loss"] = float(step["loss"])
    if _finite(step.get("reward_mean")):
        out["train_mean_reward"] = float(step["reward_mean"])
    evaluation = logged.filter(kind=JobEventKind.EVAL).values_list("data", flat=True).first() or {}
    if _finite(evaluation.get("reward")):
        out["valid_mean_reward"] = float(evaluation["reward"])
    return out
