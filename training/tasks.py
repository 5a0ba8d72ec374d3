"""Celery tasks of the training app: shells that take ids and call one service.

- `training.run_job`: `training` (one GPU or the CPU, concurrency 1).
- `training.evaluation_run`: `default` (generation through the inference server, judge
  calls), or `training` when the evaluation generates in the worker with transformers.
- `training.release_run`: `deploy` — the only queue that changes what the server serves.
- `training.release_adapter_unload`: `deploy`, queued by a release's flip with a countdown.
- `training.learning_policies_tick`: `default`, from the beat schedule (`webapp/celery.py`);
  it queues jobs and evaluations and never waits for them.
- `training.rollouts_tick`: `default`, from the beat schedule: each running progressive
  release's check (`training.promotion.services.rollouts`).
"""

from __future__ import annotations

from celery import shared_task

from webapp.kernel.work import work_worker_name


@shared_task(bind=True, name="training.run_job", queue="training", acks_late=True, reject_on_worker_lost=True)
def training_job_run_task(self, job_id: int) -> None:
    from training.services.job_start import training_job_run

    training_job_run(job_id=job_id, worker=work_worker_name(self.request.hostname))


@shared_task(bind=True, name="training.evaluation_run", queue="default", acks_late=True, reject_on_worker_lost=True)
def evaluation_run_task(self, evaluation_id: int) -> None:
    from training.promotion.services.evaluation import evaluation_run

    evaluation_run(evaluation_id=evaluation_id, worker=work_worker_name(self.request.hostname))


@shared_task(bind=True, name="training.release_run", queue="deploy", acks_late=True, reject_on_worker_lost=True)
def release_run_task(self, release_id: int) -> None:
    from training.promotion.services.release import release_run

    release_run(release_id=release_id, worker=work_worker_name(self.request.hostname))


@shared_task(name="training.release_adapter_unload", queue="deploy", ignore_result=True)
def release_adapter_unload_task(version_id: int) -> None:
    from training.promotion.services.release import release_adapter_unload

    release_adapter_unload(version_id=version_id)


@shared_task(name="training.learning_policies_tick", queue="default", ignore_result=True)
def learning_policies_tick_task() -> None:
    from training.learning_policies.tick import learning_policies_tick

    learning_policies_tick()


@shared_task(name="training.rollouts_tick", queue="default", ignore_result=True)
def rollouts_tick_task() -> None:
    """Every running progressive release's check: advance, roll back or wait."""
    from training.promotion.services.rollouts import rollouts_tick

    rollouts_tick()
