"""Celery tasks of the `training` queue: shells that take ids and call one service."""

from __future__ import annotations

import os
import socket
import uuid

from celery import shared_task


@shared_task(bind=True, name="training.run_job", queue="training", acks_late=True, reject_on_worker_lost=True)
def training_job_run_task(self, job_id: int) -> None:
    from training.services.job_runner import training_job_run

    # Unique per run, so a stale worker's late writes cannot touch a job another worker took over.
    host = self.request.hostname or socket.gethostname()
    training_job_run(job_id=job_id, worker=f"{host}:{os.getpid()}:{uuid.uuid4().hex[:8]}")


@shared_task(name="training.check_stale_jobs", queue="default")
def training_check_stale_jobs_task() -> None:
    from training.services.jobs import training_jobs_check_stale

    training_jobs_check_stale()
