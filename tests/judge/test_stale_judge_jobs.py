"""A judge job whose worker died does not stay "running": the periodic sweep fails it with the
reason, and a worker that was only slow stops at its next turn instead of overwriting that."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from feedback.models import JudgeJob, JudgeResult, JudgeStatus, JudgeTrigger
from feedback.services.judge_jobs import judge_job_create, judge_job_run, judge_jobs_fail_stale
from feedback.services.judging import judge_request
from tests.fixtures.judge import Reply
from tests.judge.conftest import VALID_JUDGEMENT
from tests.judge.test_judge_pages import commented_traces
from webapp.kernel.work import WorkStatus, work_claim, work_end
from webapp.tasks import stale_work_sweep_task

pytestmark = pytest.mark.django_db


def test_a_silent_judge_job_is_failed_with_the_reason_and_a_beating_one_is_left(
    make_trace, operator, judge_settings, settings
):
    settings.JUDGE_DEADLINE_S, settings.JUDGE_STALE_GRACE_S = 300, 120
    commented_traces(make_trace, operator, 2)
    now = timezone.now()
    silent, beating, never = (judge_job_create(created_by=operator) for _ in range(3))
    JudgeJob.objects.filter(pk=silent.pk).update(
        status=WorkStatus.RUNNING, started_at=now - timedelta(hours=1), heartbeat_at=now - timedelta(seconds=421)
    )
    JudgeJob.objects.filter(pk=beating.pk).update(
        status=WorkStatus.RUNNING, started_at=now - timedelta(hours=1), heartbeat_at=now - timedelta(seconds=419)
    )
    # Died before its first beat.
    JudgeJob.objects.filter(pk=never.pk).update(status=WorkStatus.RUNNING, started_at=now - timedelta(hours=2))

    assert sorted(judge_jobs_fail_stale(now=now)) == sorted([silent.pk, never.pk])

    silent.refresh_from_db()
    assert silent.status == WorkStatus.FAILED and silent.finished_at == now
    assert "the worker stopped" in silent.error and "421 s" in silent.error and "420 s" in silent.error
    assert JudgeJob.objects.get(pk=beating.pk).status == WorkStatus.RUNNING
    assert judge_jobs_fail_stale(now=now) == [], "a failed job is failed once"


def test_the_periodic_task_sweeps_judge_jobs(make_trace, operator, judge_settings):
    commented_traces(make_trace, operator, 1)
    job = judge_job_create(created_by=operator)
    long_ago = timezone.now() - timedelta(days=1)
    JudgeJob.objects.filter(pk=job.pk).update(status=WorkStatus.RUNNING, started_at=long_ago, heartbeat_at=long_ago)

    stale_work_sweep_task()

    assert JudgeJob.objects.get(pk=job.pk).status == WorkStatus.FAILED


def test_a_worker_that_was_only_slow_stops_at_its_next_turn_and_keeps_the_sweeps_outcome(
    make_trace, operator, judge_settings, monkeypatch
):
    from feedback.services import judge_jobs

    commented_traces(make_trace, operator, 3)
    judge_settings.respond_with(lambda request: Reply.json(VALID_JUDGEMENT))
    job = judge_job_create(created_by=operator)
    real_judge_run = judge_jobs.judge_run

    def slow_judge_run(**kwargs):
        # While the first turn is being judged, the sweep finds the job silent.
        result = real_judge_run(**kwargs)
        JudgeJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(days=1))
        assert judge_jobs_fail_stale() == [job.pk]
        return result

    monkeypatch.setattr(judge_jobs, "judge_run", slow_judge_run)
    after = judge_job_run(job=job)

    assert after.status == WorkStatus.FAILED and "the worker stopped" in after.error
    assert len(judge_settings.requests) == 1, "no turn is judged after the sweep failed the job"


def test_a_job_taken_up_again_counts_its_silence_from_the_new_worker(make_trace, operator, judge_settings, monkeypatch):
    from feedback.services import judge_jobs

    commented_traces(make_trace, operator, 2)
    judge_settings.respond_with(lambda request: Reply.json(VALID_JUDGEMENT))
    job = judge_job_create(created_by=operator)
    judge_job_run(job=JudgeJob.objects.get(pk=job.pk))  # plans and judges both turns
    # The first worker died long ago, with the job still running; Celery hands it out again.
    long_ago = timezone.now() - timedelta(days=1)
    JudgeJob.objects.filter(pk=job.pk).update(status=WorkStatus.RUNNING, heartbeat_at=long_ago)
    judge_jobs.JudgeResult.objects.filter(job=job).order_by("-id").first().delete()
    swept = []
    real_judge_run = judge_jobs.judge_run

    def judge_run_then_sweep(**kwargs):
        swept.append(judge_jobs_fail_stale())  # the sweep runs while the new worker judges
        return real_judge_run(**kwargs)

    monkeypatch.setattr(judge_jobs, "judge_run", judge_run_then_sweep)
    after = judge_job_run(job=JudgeJob.objects.get(pk=job.pk))

    assert swept == [[]] and after.status == WorkStatus.FINISHED


def test_a_job_taken_over_judges_again_the_turn_its_dead_worker_was_in_the_middle_of(
    make_trace, operator, judge_settings
):
    traces = commented_traces(make_trace, operator, 1)
    turn = traces[0].messages.get(position=4)
    judge_settings.respond_with(lambda request: Reply.json(VALID_JUDGEMENT))
    job = judge_job_create(created_by=operator)
    # The first worker planned the job and had claimed its one judgement when it died; the
    # judgement's own heartbeat is recent, so only the job's takeover can free it.
    now = timezone.now()
    JudgeJob.objects.filter(pk=job.pk).update(
        status=WorkStatus.RUNNING, worker="w-died", started_at=now, heartbeat_at=now, attempts=1
    )
    JudgeJob.objects.filter(pk=job.pk).update(message_ids=[turn.pk], total=1)
    stuck = judge_request(message=turn, trigger=JudgeTrigger.BACKFILL, job=job, enqueue=False)
    assert work_claim(JudgeResult, pk=stuck.pk, worker="w-died")

    after = judge_job_run(job=JudgeJob.objects.get(pk=job.pk), worker="w-next")

    assert (after.status, after.succeeded, after.failed) == (WorkStatus.FINISHED, 1, 0)
    judged = JudgeResult.objects.get(pk=stuck.pk)
    assert (judged.status, judged.worker, judged.attempts) == (JudgeStatus.SUCCEEDED, "w-next", 2)
    late = work_end(JudgeResult, pk=stuck.pk, worker="w-died", status=JudgeStatus.FAILED, error="late")
    assert (late.status, late.error) == (JudgeStatus.SUCCEEDED, ""), "the dead worker's late outcome is dropped"
