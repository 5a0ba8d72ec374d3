"""Periodic work that spans the apps."""

from __future__ import annotations

import logging

from celery import shared_task

from feedback.failure_modes.services import failure_mode_runs_fail_stale
from feedback.models import FailureModeRun, JudgeJob
from feedback.services.judge_jobs import judge_jobs_fail_stale
from feedback.services.judging import judge_results_fail_stale
from training.promotion.services.evaluation import evaluations_fail_stale
from training.promotion.services.release import releases_fail_stale
from training.services.jobs import training_jobs_check_stale

logger = logging.getLogger(__name__)


@shared_task(name="webapp.stale_work_sweep", queue="default", ignore_result=True)
def stale_work_sweep_task() -> None:
    """The one sweep for background work whose worker died (webapp/kernel/stale_work.py): training
    jobs resume from their checkpoint or fail; judgements, judge jobs, failure-mode runs,
    evaluations and releases fail (a release queued with no worker taking it, too, as it
    blocks its deployment's next one). Each kind is swept on its own, so one kind's error does not keep
    the others running forever."""
    for sweep in (
        _legacy_done_to_finished,
        training_jobs_check_stale,
        judge_results_fail_stale,
        judge_jobs_fail_stale,
        failure_mode_runs_fail_stale,
        evaluations_fail_stale,
        releases_fail_stale,
    ):
        try:
            sweep()
        except Exception:
            logger.exception("the stale-work sweep %s failed", sweep.__name__)


def _legacy_done_to_finished() -> None:
    """A worker still on the code before one status vocabulary may write "done" after the
    migration (a rolling upgrade); its rows are read as "finished" from the next sweep on."""
    for model in (JudgeJob, FailureModeRun):
        model.objects.filter(status="done").update(status="finished")


# The names the judge and training sweeps had before there was one: a beat or a queue still on
# the earlier code sends them during an upgrade, and they do the one sweep's work.
@shared_task(name="feedback.judge_fail_stale", queue="default", ignore_result=True)
def legacy_judge_fail_stale_task() -> None:
    stale_work_sweep_task()


@shared_task(name="training.check_stale_jobs", queue="default", ignore_result=True)
def legacy_training_check_stale_jobs_task() -> None:
    stale_work_sweep_task()
