"""Backfill batches: judge every feedback-bearing assistant turn that matches, one by one,
with progress on the job row (the source of truth the dashboard polls)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import Exists, F, OuterRef
from django.utils import timezone

from feedback.judge.client import JudgeEndpoint, JudgeNotConfigured
from feedback.judge.prompts import CURRENT_TURN
from feedback.models import (
    Comment,
    Correction,
    CustomerFeedback,
    JudgeJob,
    JudgeResult,
    JudgeStatus,
    JudgeTrigger,
    Message,
    MessageRole,
)
from feedback.selectors.judge import judge_endpoint_for
from feedback.services.judging import JudgeError, judge_request, judge_run, judgement_silent_after
from feedback.tasks import judge_job_run_task
from webapp.kernel.stale_work import stale_work_fail
from webapp.kernel.work import (
    WorkStatus,
    work_attempts_exceeded,
    work_beat,
    work_cancel,
    work_claim,
    work_end,
    work_worker_name,
)


def feedback_turns(*, deployment=None, since: datetime | None = None) -> Any:
    """Assistant turns with an operator comment or customer feedback on them (or, for
    trace-level customer feedback, the trace's last assistant turn), newest first."""
    has_comment = Exists(Comment.objects.filter(message=OuterRef("pk")))
    has_feedback = Exists(CustomerFeedback.objects.filter(message=OuterRef("pk")))
    has_correction = Exists(Correction.objects.filter(message=OuterRef("pk")))
    later_assistant = Exists(
        Message.objects.filter(
            trace_id=OuterRef("trace_id"), role=MessageRole.ASSISTANT, position__gt=OuterRef("position")
        )
    )
    trace_feedback = Exists(CustomerFeedback.objects.filter(trace_id=OuterRef("trace_id"), message__isnull=True))
    qs = Message.objects.filter(role=MessageRole.ASSISTANT).filter(
        has_comment | has_feedback | has_correction | (trace_feedback & ~later_assistant)
    )
    if deployment is not None:
        qs = qs.filter(trace__deployment=deployment)
    if since is not None:
        qs = qs.filter(trace__started_at__gte=since)
    return qs.order_by("-trace__started_at", "-trace_id", "position")


@transaction.atomic
def judge_job_create(
    *,
    deployment=None,
    since: datetime | None = None,
    limit: int = 1000,
    only_unjudged: bool = True,
    created_by=None,
) -> JudgeJob:
    if limit < 1 or limit > 100_000:
        raise JudgeError("limit must be between 1 and 100000")
    endpoint = judge_endpoint_for(deployment=deployment)  # raises JudgeNotConfigured
    job = JudgeJob.objects.create(
        deployment=deployment,
        since=since,
        limit=limit,
        only_unjudged=only_unjudged,
        judge_model=endpoint.model,
        prompt_version=CURRENT_TURN.version,
        created_by=created_by,
    )
    judge_job_run_task.delay_on_commit(job.pk)
    return job


def _job_targets(job: JudgeJob) -> list[int]:
    qs = feedback_turns(deployment=job.deployment, since=job.since)
    if job.only_unjudged:
        qs = qs.exclude(
            Exists(
                JudgeResult.objects.filter(
                    message=OuterRef("pk"),
                    status=JudgeStatus.SUCCEEDED,
                    judge_model=job.judge_model,
                    prompt_version=job.prompt_version,
                )
            )
        )
    return list(qs.values_list("pk", flat=True)[: job.limit])


def judge_job_run(*, job: JudgeJob, endpoint: JudgeEndpoint | None = None, worker: str | None = None) -> JudgeJob:
    """Judge the job's turns one by one, counting progress after each. The list of turns
    is fixed when the job starts; a redelivered job (its worker died) resumes where it
    stopped, and a cancel request stops it between two turns."""
    worker = worker or work_worker_name()
    job.refresh_from_db()  # the caller's copy may be stale: a cancel may have come since
    if job.status == WorkStatus.QUEUED:
        plan = _job_targets(job)
        # Claimed after planning: the first turn gets the whole silence limit. Only if still
        # queued: a cancel that got there first stands.
        claimed = work_claim(JudgeJob, pk=job.pk, worker=worker, fields={"total": len(plan), "message_ids": plan})
    else:
        # The judgement the dead worker was in the middle of runs again, and this worker's
        # silence is counted from now, not from the dead one's last beat.
        claimed = work_claim(JudgeJob, pk=job.pk, worker=worker, resume_after=0)
        if claimed is not None:
            # Pending again and no one's: the dead worker's late outcome is dropped, and
            # this worker claims it anew.
            JudgeResult.objects.filter(job=job, status=JudgeStatus.RUNNING).update(
                status=JudgeStatus.PENDING, worker=""
            )
    if claimed is None:
        job.refresh_from_db()
        return job
    job = claimed
    too_many = work_attempts_exceeded(job)
    if too_many:
        return _job_end(job, worker, WorkStatus.FAILED, too_many)
    try:
        endpoint = endpoint or judge_endpoint_for(deployment=job.deployment)
    except JudgeNotConfigured as exc:
        return _job_end(job, worker, WorkStatus.FAILED, str(exc))
    finished = set(
        JudgeResult.objects.filter(job=job).exclude(status=JudgeStatus.PENDING).values_list("message_id", flat=True)
    )
    for message_id in job.message_ids:
        if message_id in finished:
            continue
        if not work_beat(JudgeJob, pk=job.pk, worker=worker):
            # Cancelled; or the sweep failed it while this worker was silent, and its
            # outcome stands (`work_end` changes nothing then).
            return _job_end(job, worker, WorkStatus.CANCELLED)
        message = Message.objects.filter(pk=message_id).first()
        if message is None:  # the trace was deleted meanwhile
            work_beat(JudgeJob, pk=job.pk, worker=worker, total=F("total") - 1)
            continue
        result = JudgeResult.objects.filter(job=job, message=message).first() or judge_request(
            message=message, trigger=JudgeTrigger.BACKFILL, job=job, requested_by=job.created_by, enqueue=False
        )
        result = judge_run(result=result, endpoint=endpoint, worker=worker)
        counter = "succeeded" if result.status == JudgeStatus.SUCCEEDED else "failed"
        work_beat(JudgeJob, pk=job.pk, worker=worker, **{counter: F(counter) + 1})
    return _job_end(job, worker, WorkStatus.FINISHED)


def judge_jobs_fail_stale(*, now=None) -> list[int]:
    """Judge jobs left running by a worker that died: failed once no turn has finished for
    longer than one judgement may take (`JUDGE_DEADLINE_S`) plus `JUDGE_STALE_GRACE_S`."""
    return stale_work_fail(
        JudgeJob,
        silent_after=judgement_silent_after(),
        now=now or timezone.now(),
        what="judge job's progress",
    )


def _job_end(job: JudgeJob, worker: str, status: str, error: str = "") -> JudgeJob:
    """End the job if this worker still holds it; one that ended meanwhile keeps its outcome."""
    return work_end(JudgeJob, pk=job.pk, worker=worker, status=status, error=error) or job


def judge_job_cancel(*, job: JudgeJob) -> JudgeJob:
    """A queued job is cancelled at once; a running one is asked to stop between two turns.
    Decided on the row as it is now, not on the caller's copy: a worker may have just started it."""
    return work_cancel(JudgeJob, pk=job.pk) or job
