"""A real Celery worker on the Redis broker runs training jobs on the tiny model: start,
progress, cancel, a worker killed mid-job and the job resumed from its checkpoint by
the periodic stale-heartbeat check, and the candidate version it creates."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from tests.fixtures.worker import process_group_stop, wait_for
from training.models import JobEventKind, TrainingJob
from training.services.jobs import training_job_cancel, training_job_create
from training.services.training_sets import training_set_from_tasks
from training.serving.models import BaseModel, LiveVersion, ModelVersion, ModelVersionKind, ModelVersionStatus
from webapp.kernel.work import WorkStatus

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


def _worker_env(tmp_path: Path) -> dict[str, str]:
    db = connection.settings_dict
    return os.environ | {
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "PRACTICUM_DATA_DIR": str(tmp_path / "data"),
        "PRACTICUM_TRAINING_DIR": str(tmp_path / "training"),
        "PRACTICUM_MODELS_DIR": str(tmp_path / "models"),
        "PRACTICUM_TRAINING_HEARTBEAT_SECONDS": "0.5",
        "PRACTICUM_TRAINING_STALE_AFTER_SECONDS": "4",
        "PRACTICUM_TRAINING_STALE_CHECK_SECONDS": "1",
        "OMP_NUM_THREADS": "1",
    }


def _start_worker(tmp_path: Path, name: str) -> subprocess.Popen:
    log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - the worker writes to it until killed
    command = [sys.executable, "-m", "celery", "-A", "webapp", "worker", "-Q", "training,default", "-P", "solo"]
    command += ["--hostname", f"{name}@%h", "--loglevel", "INFO", "-B", "--schedule", str(tmp_path / f"{name}-beat")]
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=_worker_env(tmp_path),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so killing it kills beat too
    )


def _job(pk: int) -> TrainingJob:
    return TrainingJob.objects.get(pk=pk)


@pytest.fixture
def setup(tiny_model_dir, tmp_path):
    # The purge keeps a previous run's leftover messages from reaching this worker.
    subprocess.run(
        [sys.executable, "-m", "celery", "-A", "webapp", "purge", "-f", "-Q", "training,default"],
        cwd=ROOT,
        env=_worker_env(tmp_path),
        capture_output=True,
        timeout=60,
    )
    base = BaseModel.objects.create(name="tiny", path=str(tiny_model_dir))
    version = ModelVersion.objects.create(
        name="tiny-base", base_model=base, kind=ModelVersionKind.BASE, path=str(tiny_model_dir)
    )
    tasks = [{"prompt": f"Say something about order A{i}.", "reference": "e", "grader": "contains"} for i in range(12)]
    return version, training_set_from_tasks(name="orders", tasks=tasks)


def test_worker_runs_cancels_and_resumes_a_killed_job(setup, tmp_path):
    version, training_set = setup
    config = {
        "prompts_per_step": 2,
        "group_size": 4,
        "max_new_tokens": 4,
        "eval_every": 0,
        "samples_every": 5,
        "learning_rate": 1e-3,
    }
    worker = _start_worker(tmp_path, "first")
    try:
        # Start and progress, then cancel from the service the page's button calls.
        long = training_job_create(
            kind="grpo",
            config=config | {"steps": 500, "checkpoint_every": 2},
            base_version=version,
            training_set=training_set,
        )
        wait_for(lambda: _job(long.pk).step >= 3, 180, "progress on the first job", tmp_path)
        assert _job(long.pk).status == WorkStatus.RUNNING and _job(long.pk).heartbeat_at is not None
        training_job_cancel(job=_job(long.pk))
        wait_for(lambda: _job(long.pk).status == WorkStatus.CANCELLED, 60, "the cancel", tmp_path)
        cancelled = _job(long.pk)
        assert cancelled.step < 500 and cancelled.result_version is None
        assert cancelled.checkpoint_step == cancelled.step  # checkpointed on the way out

        # A job whose worker is killed (SIGKILL: no chance to clean up) mid-run.
        job = training_job_create(
            kind="grpo",
            config=config | {"steps": 14, "checkpoint_every": 3},
            base_version=version,
            training_set=training_set,
        )
        wait_for(lambda: _job(job.pk).checkpoint_step >= 3 and _job(job.pk).step >= 4, 180, "a checkpoint", tmp_path)
        process_group_stop(worker, signal.SIGKILL)
        killed_at = _job(job.pk)
        assert killed_at.status == WorkStatus.RUNNING and killed_at.step < 14

        # A new worker (with beat) notices the silent heartbeat and resumes the job.
        worker = _start_worker(tmp_path, "second")
        wait_for(lambda: _job(job.pk).status == WorkStatus.FINISHED, 240, "the resumed job to finish", tmp_path)
    finally:
        process_group_stop(worker)

    job = _job(job.pk)
    assert job.attempts == 2 and job.step == 14
    logs = [e.data["message"] for e in job.events.filter(kind=JobEventKind.LOG)]
    assert any("re-queued to resume from checkpoint" in m for m in logs)
    assert any(m.startswith("resuming on second@") for m in logs)
    steps = sorted({e.step for e in job.events.filter(kind=JobEventKind.STEP)})
    assert steps == list(range(1, 15))
    # After the restart the loop went on from a checkpoint, not from step 1: the last one the
    # job recorded, or one the killed worker wrote to disk after it and did not get to record
    # (every 3 steps, at most the step it had reached).
    resumed = job.events.get(kind=JobEventKind.LOG, data__message__startswith="resuming on second@")
    first_after = job.events.filter(kind=JobEventKind.STEP, id__gt=resumed.id).order_by("id").first()
    assert killed_at.checkpoint_step + 1 <= first_after.step <= killed_at.step + 1
    assert (first_after.step - 1) % 3 == 0

    candidate = job.result_version
    assert candidate.status == ModelVersionStatus.CANDIDATE and candidate.parent == version
    assert candidate.kind == ModelVersionKind.LORA and (Path(candidate.path) / "adapter_model.safetensors").exists()
    assert not LiveVersion.objects.exists()
    assert settings.CELERY_BROKER_URL.startswith("redis://")
