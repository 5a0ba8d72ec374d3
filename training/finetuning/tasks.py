"""Celery tasks of the fine-tuning API: shells on the `default` queue that take ids and call
one service, so reading a file's lines and building a job's training set happen off the
request path.

- `finetuning.file_validate`: an upload's lines are read (`uploaded` → `processed`/`error`).
- `finetuning.job_prepare`: a job's files become its training set and the job is queued on
  `training` (or fails, saying which file and why).
"""

from __future__ import annotations

from celery import shared_task


@shared_task(name="finetuning.file_validate", queue="default", ignore_result=True)
def file_validate_task(file_id: str) -> None:
    from training.finetuning.files import file_validate

    file_validate(file_id=file_id)


@shared_task(name="finetuning.job_prepare", queue="default", ignore_result=True)
def fine_tuning_job_prepare_task(job_id: int) -> None:
    from training.finetuning.jobs import fine_tuning_job_prepare

    fine_tuning_job_prepare(job_id=job_id)
