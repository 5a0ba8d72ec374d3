"""A failure-mode run whose worker died does not stay "running": the one stale-work sweep fails
it with the reason, and a worker that was only slow stops at its next step instead of
overwriting that. Judge jobs and failure-mode runs that ended well say "finished", as every
other kind of work does, and the migration carries stored rows over."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

import feedback.failure_modes.services as pipeline
from feedback.failure_modes.services import failure_mode_run_execute, failure_mode_runs_fail_stale
from feedback.models import FailureModeRun, Trace
from tests.factories import DeploymentFactory, TraceFactory
from webapp.kernel.work import WorkStatus
from webapp.tasks import stale_work_sweep_task

pytestmark = pytest.mark.django_db


def test_a_silent_run_is_failed_with_the_reason_and_a_beating_one_is_left(settings):
    settings.FAILURE_MODE_STALE_AFTER_SECONDS = 600
    now = timezone.now()
    silent, beating, never = (FailureModeRun.objects.create(status=WorkStatus.RUNNING) for _ in range(3))
    FailureModeRun.objects.filter(pk=silent.pk).update(
        started_at=now - timedelta(hours=1), heartbeat_at=now - timedelta(seconds=601)
    )
    FailureModeRun.objects.filter(pk=beating.pk).update(
        started_at=now - timedelta(hours=1), heartbeat_at=now - timedelta(seconds=599)
    )
    FailureModeRun.objects.filter(pk=never.pk).update(started_at=now - timedelta(hours=2))

    assert sorted(failure_mode_runs_fail_stale(now=now)) == sorted([silent.pk, never.pk])

    silent.refresh_from_db()
    assert silent.status == WorkStatus.FAILED and "601 s" in silent.error and "600 s" in silent.error
    assert FailureModeRun.objects.get(pk=beating.pk).status == WorkStatus.RUNNING
    assert failure_mode_runs_fail_stale(now=now) == []


def test_the_one_periodic_sweep_covers_failure_mode_runs():
    long_ago = timezone.now() - timedelta(days=1)
    run = FailureModeRun.objects.create(status=WorkStatus.RUNNING, started_at=long_ago, heartbeat_at=long_ago)

    stale_work_sweep_task()

    assert FailureModeRun.objects.get(pk=run.pk).status == WorkStatus.FAILED


def test_a_run_beats_as_it_goes_and_a_worker_swept_meanwhile_stops_and_keeps_the_failure(monkeypatch):
    deployment = DeploymentFactory()
    for i in range(3):
        TraceFactory(deployment=deployment, external_id=f"t{i}")
    run = FailureModeRun.objects.create(deployment=deployment)
    detect = pipeline.detect_batch
    beats = []

    def detect_then_get_swept(views):
        beats.append(FailureModeRun.objects.get(pk=run.pk).heartbeat_at)
        # The worker stalls past the limit; the sweep fails the run meanwhile.
        FailureModeRun.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(days=1))
        failure_mode_runs_fail_stale()
        return detect(views)

    monkeypatch.setattr(pipeline, "detect_batch", detect_then_get_swept)

    failure_mode_run_execute(run=run)

    run.refresh_from_db()
    assert beats and beats[0] is not None
    assert run.status == WorkStatus.FAILED and "the worker stopped" in run.error
    assert run.stage == "detecting" and Trace.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_the_migration_carries_done_jobs_and_runs_over_to_finished_and_back():
    executor = MigrationExecutor(connection)
    before, after = [("feedback", "0012_otel_spans")], [("feedback", "0013_work_status_finished_and_run_heartbeat")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    user = old.get_model("auth", "User").objects.create(username="olga")
    job = old.get_model("feedback", "JudgeJob").objects.create(status="done", created_by_id=user.pk)
    run = old.get_model("feedback", "FailureModeRun").objects.create(status="done")
    failed = old.get_model("feedback", "FailureModeRun").objects.create(status="failed")

    executor = MigrationExecutor(connection)
    executor.migrate(after)
    new = executor.loader.project_state(after).apps
    assert new.get_model("feedback", "JudgeJob").objects.get(pk=job.pk).status == "finished"
    assert new.get_model("feedback", "FailureModeRun").objects.get(pk=run.pk).status == "finished"
    assert new.get_model("feedback", "FailureModeRun").objects.get(pk=failed.pk).status == "failed"

    executor = MigrationExecutor(connection)
    executor.migrate(before)
    assert old.get_model("feedback", "JudgeJob").objects.get(pk=job.pk).status == "done"
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_during_an_upgrade_the_old_task_names_sweep_and_an_old_workers_done_reads_finished():
    from feedback.models import JudgeJob
    from tests.factories import user_with_role
    from webapp.tasks import legacy_judge_fail_stale_task, legacy_training_check_stale_jobs_task

    run = FailureModeRun.objects.create(status="done")  # written by a worker on the earlier code
    job = JudgeJob.objects.create(status="done", created_by=user_with_role("operator"))
    long_ago = timezone.now() - timedelta(days=1)
    stuck = FailureModeRun.objects.create(status=WorkStatus.RUNNING, started_at=long_ago, heartbeat_at=long_ago)

    legacy_judge_fail_stale_task()

    assert FailureModeRun.objects.get(pk=run.pk).status == WorkStatus.FINISHED
    assert JudgeJob.objects.get(pk=job.pk).status == WorkStatus.FINISHED
    assert FailureModeRun.objects.get(pk=stuck.pk).status == WorkStatus.FAILED
    legacy_training_check_stale_jobs_task()  # the other old name runs the same sweep
