"""The one lifecycle of background work (webapp/kernel/work.py), on every kind that uses it: of two
workers claiming one item only one runs it, a redelivered item is taken over and the first
worker's writes change nothing, a worker the sweep took the item from is told to stop and
cannot finish over the sweep's outcome, and a cancel ends a queued item at once and asks a
running one to stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from feedback.failure_modes.services import failure_mode_runs_fail_stale
from feedback.models import FailureModeRun, JudgeJob, JudgeResult
from feedback.services.judge_jobs import judge_jobs_fail_stale
from feedback.services.judging import judge_results_fail_stale
from tests.factories import DeploymentFactory, MessageFactory
from training.models import TrainingJob
from training.promotion.models import Evaluation
from training.promotion.services.evaluation import evaluations_fail_stale
from training.services.jobs import training_jobs_check_stale
from training.serving.models import BaseModel, ModelVersion
from webapp.kernel.work import WorkItem, WorkStatus, work_beat, work_cancel, work_claim, work_end


def _version(name: str, kind: str = "base") -> ModelVersion:
    base, _ = BaseModel.objects.get_or_create(name="tiny", defaults={"path": "/models/tiny"})
    return ModelVersion.objects.create(name=name, base_model=base, kind=kind, path=f"/models/{name}")


def _training_job() -> TrainingJob:
    return TrainingJob.objects.create(kind="grpo", config={}, base_version=_version(f"base-{time.monotonic_ns()}"))


def _evaluation() -> Evaluation:
    stamp = time.monotonic_ns()
    baseline = _version(f"live-{stamp}")
    return Evaluation.objects.create(
        deployment=DeploymentFactory(), candidate=_version(f"cand-{stamp}", "lora"), baseline=baseline, total=3
    )


def _judgement() -> JudgeResult:
    turn = MessageFactory(role="assistant", content="Your order has shipped.")
    return JudgeResult.objects.create(trace=turn.trace, message=turn, trigger="manual")


@dataclass(frozen=True)
class Kind:
    model: type[WorkItem]
    make: Callable[[], WorkItem]
    sweep: Callable[[datetime], object]
    # How the kind's worker claims a queued item (resume_after): training jobs and judgements
    # resume one whose worker went silent; the others take over a redelivered one at once.
    resume_after: float | None

    def __str__(self) -> str:
        return self.model.__name__


JUDGE_JOB = Kind(JudgeJob, lambda: JudgeJob.objects.create(), lambda now: judge_jobs_fail_stale(now=now), None)
FAILURE_MODE_RUN = Kind(
    FailureModeRun, lambda: FailureModeRun.objects.create(), lambda now: failure_mode_runs_fail_stale(now=now), 0
)
TRAINING_JOB = Kind(TrainingJob, _training_job, lambda now: training_jobs_check_stale(now=now), 600)
EVALUATION = Kind(Evaluation, _evaluation, lambda now: evaluations_fail_stale(now=now), 0)
KINDS = [JUDGE_JOB, FAILURE_MODE_RUN, TRAINING_JOB, EVALUATION]
# Judgements wait as `pending` and are never cancelled (no page or API offers it).
JUDGEMENT = Kind(JudgeResult, _judgement, lambda now: judge_results_fail_stale(now=now), 220)


@pytest.fixture(autouse=True)
def _settings(settings):
    settings.TRAINING_STALE_AFTER_SECONDS = 600
    settings.TRAINING_MAX_ATTEMPTS = 1  # a silent job is failed, not queued again


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", [JUDGE_JOB, TRAINING_JOB, JUDGEMENT], ids=str)
def test_of_two_workers_claiming_one_item_at_once_only_one_runs_it(kind):
    item = kind.make()
    got: dict[str, WorkItem | None] = {}

    def claim(worker: str) -> None:
        try:
            got[worker] = work_claim(kind.model, pk=item.pk, worker=worker, resume_after=kind.resume_after)
        finally:
            connection.close()

    workers = [threading.Thread(target=claim, args=(name,)) for name in ("w1", "w2")]
    # Both deliveries arrive while the row is locked, so both read it once the lock goes:
    # without the claim's own lock both would find it queued and run it.
    with transaction.atomic():
        kind.model.objects.select_for_update().get(pk=item.pk)
        for thread in workers:
            thread.start()
        time.sleep(0.5)
    for thread in workers:
        thread.join(timeout=30)

    winners = [name for name, claimed in got.items() if claimed is not None]
    assert len(got) == 2 and len(winners) == 1
    row = kind.model.objects.get(pk=item.pk)
    assert row.status == WorkStatus.RUNNING and row.worker == winners[0] and row.started_at and row.heartbeat_at
    if isinstance(row, TrainingJob):
        assert row.attempts == 1


@pytest.mark.django_db
@pytest.mark.parametrize("kind", [FAILURE_MODE_RUN, EVALUATION], ids=str)
def test_a_redelivered_item_is_taken_over_and_the_first_worker_writes_nothing_after(kind):
    item = kind.make()
    assert work_claim(kind.model, pk=item.pk, worker="w1", resume_after=kind.resume_after)
    assert work_claim(kind.model, pk=item.pk, worker="w2", resume_after=kind.resume_after)

    assert work_beat(kind.model, pk=item.pk, worker="w1", error="late") is False
    assert work_end(kind.model, pk=item.pk, worker="w1", status=WorkStatus.FINISHED).status == WorkStatus.RUNNING
    row = kind.model.objects.get(pk=item.pk)
    assert row.worker == "w2" and row.error == "" and row.finished_at is None
    assert work_beat(kind.model, pk=item.pk, worker="w2") is True


@pytest.mark.django_db
def test_a_training_job_is_resumed_only_once_its_worker_is_silent():
    job = _training_job()
    assert work_claim(TrainingJob, pk=job.pk, worker="w1", resume_after=600)
    assert work_claim(TrainingJob, pk=job.pk, worker="w2", resume_after=600) is None, "w1 is alive"
    TrainingJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=601))
    resumed = work_claim(TrainingJob, pk=job.pk, worker="w2", resume_after=600)
    assert resumed is not None and resumed.worker == "w2" and resumed.attempts == 2


@pytest.mark.django_db
@pytest.mark.parametrize("kind", [*KINDS, JUDGEMENT], ids=str)
def test_a_worker_the_sweep_took_the_item_from_is_told_to_stop_and_cannot_finish_over_it(kind):
    item = kind.make()
    assert work_claim(kind.model, pk=item.pk, worker="w1", resume_after=kind.resume_after)
    assert work_beat(kind.model, pk=item.pk, worker="w1") is True

    kind.sweep(timezone.now() + timedelta(days=1))

    swept = kind.model.objects.get(pk=item.pk)
    assert swept.status == WorkStatus.FAILED and "the worker stopped" in swept.error and swept.finished_at
    assert work_beat(kind.model, pk=item.pk, worker="w1") is False
    assert kind.model.objects.get(pk=item.pk).heartbeat_at == swept.heartbeat_at, "the late beat wrote nothing"
    ended = work_end(kind.model, pk=item.pk, worker="w1", status=WorkStatus.FINISHED, error="")
    assert (ended.status, ended.error, ended.finished_at) == (swept.status, swept.error, swept.finished_at)


@pytest.mark.django_db
@pytest.mark.parametrize("kind", KINDS, ids=str)
def test_a_cancel_ends_a_queued_item_at_once_and_asks_a_running_one_to_stop(kind):
    queued = work_cancel(kind.model, pk=kind.make().pk)
    assert queued.status == WorkStatus.CANCELLED and queued.finished_at
    assert work_claim(kind.model, pk=queued.pk, worker="w1", resume_after=kind.resume_after) is None

    item = kind.make()
    assert work_claim(kind.model, pk=item.pk, worker="w1", resume_after=kind.resume_after)
    asked = work_cancel(kind.model, pk=item.pk)
    winds_down = WorkStatus.CANCELLING in kind.model.HELD_STATUSES
    assert asked.cancel_requested and asked.finished_at is None
    assert asked.status == (WorkStatus.CANCELLING if winds_down else WorkStatus.RUNNING)
    assert work_beat(kind.model, pk=item.pk, worker="w1") is False, "the worker is told to stop"
    assert work_end(kind.model, pk=item.pk, worker="w1", status=WorkStatus.CANCELLED).status == WorkStatus.CANCELLED


def _run_judge_job(item):
    from feedback.services.judge_jobs import judge_job_run

    return judge_job_run(job=item, worker="w-next")


def _run_failure_modes(item):
    from feedback.failure_modes.services import failure_mode_run_execute

    return failure_mode_run_execute(run=item, worker="w-next")


def _run_evaluation(item):
    from training.promotion.services.evaluation import evaluation_run

    return evaluation_run(evaluation_id=item.pk, worker="w-next")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "kind,run",
    [(JUDGE_JOB, _run_judge_job), (FAILURE_MODE_RUN, _run_failure_modes), (EVALUATION, _run_evaluation)],
    ids=["JudgeJob", "FailureModeRun", "Evaluation"],
)
def test_an_item_whose_work_kills_every_worker_is_failed_at_the_cap_not_redelivered_forever(settings, kind, run):
    # Each redelivery takes over at once and beats the heart, so the sweep never sees such
    # an item silent: only the count of starts can end it.
    settings.WORK_MAX_ATTEMPTS = 3
    item = kind.make()
    kind.model.objects.filter(pk=item.pk).update(
        status=WorkStatus.RUNNING, worker="w-died", started_at=timezone.now(), heartbeat_at=timezone.now(), attempts=3
    )
    run(kind.model.objects.get(pk=item.pk))
    item = kind.model.objects.get(pk=item.pk)
    assert item.status == WorkStatus.FAILED and item.finished_at is not None
    assert "started 3 times and stopped mid-way each time" in item.error

    # Below the cap a redelivery still takes over, and counts the start.
    fresh = kind.make()
    kind.model.objects.filter(pk=fresh.pk).update(
        status=WorkStatus.RUNNING, worker="w-died", started_at=timezone.now(), heartbeat_at=timezone.now(), attempts=2
    )
    run(kind.model.objects.get(pk=fresh.pk))
    fresh = kind.model.objects.get(pk=fresh.pk)
    assert fresh.attempts == 3 and "stopped mid-way" not in fresh.error
