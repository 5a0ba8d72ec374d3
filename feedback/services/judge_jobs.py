"""Backfill batches: judge every feedback-bearing assistant turn that matches, one by one,
with progress on the job row (the source of truth the dashboard polls)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
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
from feedback.services.judging import JudgeError, judge_request, judge_run
from feedback.tasks import judge_job_run_task
from webapp.stale_work import stale_work_fail
from webapp.work import WorkStatus


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


def judge_job_run(*, job: JudgeJob, endpoint: JudgeEndpoint | None = None) -> JudgeJob:
    """Judge the job's turns one by one, counting progress after each. The list of turns
    is fixed when the job starts; a redelivered job (its worker died) resumes where it
    stopped, and a cancel request stops it between two turns."""
    job.refresh_from_db()  # the caller's copy may be stale: a cancel may have come since
    if job.status not in (WorkStatus.QUEUED, WorkStatus.RUNNING):
        return job
    if job.status == WorkStatus.QUEUED:
        plan = _job_targets(job)
        now = timezone.now()  # after planning: the first turn gets the whole silence limit
        # Started only if still queued: a cancel that got there first stands.
        JudgeJob.objects.filter(pk=job.pk, status=WorkStatus.QUEUED).update(
            status=WorkStatus.RUNNING, started_at=now, heartbeat_at=now, total=len(plan), message_ids=plan
        )
        job.refresh_from_db()
        if job.status != WorkStatus.RUNNING:
            return job
    else:
        # The judgement the dead worker was in the middle of runs again, and this worker's
        # silence is counted from now, not from the dead one's last beat.
        JudgeJob.objects.filter(pk=job.pk, status=WorkStatus.RUNNING).update(heartbeat_at=timezone.now())
        JudgeResult.objects.filter(job=job, status=JudgeStatus.RUNNING).update(status=JudgeStatus.PENDING)
        job.refresh_from_db()
    try:
        endpoint = endpoint or judge_endpoint_for(deployment=job.deployment)
    except JudgeNotConfigured as exc:
        return _job_finish(job, WorkStatus.FAILED, str(exc))
    finished = set(
        JudgeResult.objects.filter(job=job).exclude(status=JudgeStatus.PENDING).values_list("message_id", flat=True)
    )
    for message_id in job.message_ids:
        if message_id in finished:
            continue
        status, cancel = JudgeJob.objects.filter(pk=job.pk).values_list("status", "cancel_requested").get()
        if status != WorkStatus.RUNNING:
            # The sweep failed it while this worker was silent: its outcome stands.
            job.refresh_from_db()
            return job
        if cancel:
            return _job_finish(job, WorkStatus.CANCELLED)
        message = Message.objects.filter(pk=message_id).first()
        if message is None:  # the trace was deleted meanwhile
            JudgeJob.objects.filter(pk=job.pk).update(total=F("total") - 1)
            continue
        result = JudgeResult.objects.filter(job=job, message=message).first() or judge_request(
            message=message, trigger=JudgeTrigger.BACKFILL, job=job, requested_by=job.created_by, enqueue=False
        )
        result = judge_run(result=result, endpoint=endpoint)
        counter = "succeeded" if result.status == JudgeStatus.SUCCEEDED else "failed"
        JudgeJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now(), **{counter: F(counter) + 1})
    return _job_finish(job, WorkStatus.FINISHED)


def judge_jobs_fail_stale(*, now=None) -> list[int]:
    """Judge jobs left running by a worker that died: failed once no turn has finished for
    longer than one judgement may take (`JUDGE_DEADLINE_S`) plus `JUDGE_STALE_GRACE_S`."""
    return stale_work_fail(
        JudgeJob,
        running=[WorkStatus.RUNNING],
        failed=WorkStatus.FAILED,
        silent_after=settings.JUDGE_DEADLINE_S + settings.JUDGE_STALE_GRACE_S,
        now=now or timezone.now(),
        what="judge job's progress",
    )


def _job_finish(job: JudgeJob, status: str, error: str = "", *, was: str = WorkStatus.RUNNING) -> JudgeJob:
    """End the job if it is still `was`; a job that ended meanwhile keeps its outcome."""
    JudgeJob.objects.filter(pk=job.pk, status=was).update(status=status, error=error, finished_at=timezone.now())
    job.refresh_from_db()
    return job


def judge_job_cancel(*, job: JudgeJob) -> JudgeJob:
    """A queued job is cancelled at once; a running one is asked to stop between two turns.
    Decided on the row as it is now, not on the caller's copy: a worker may have just started it."""
    job = _job_finish(job, WorkStatus.CANCELLED, was=WorkStatus.QUEUED)
    if job.status == WorkStatus.RUNNING:
        JudgeJob.objects.filter(pk=job.pk, status=WorkStatus.RUNNING).update(cancel_requested=True)
        job.refresh_from_db()
    return job
