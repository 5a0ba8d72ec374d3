"""Celery tasks of the feedback app: shells that re-read a row and call one service.

All run on the `default` queue. A task whose row is gone returns; a redelivered task
finds its row no longer pending (or resumes a running batch) and does no double work.
"""

from __future__ import annotations

from celery import shared_task

from feedback.models import FailureModeRun, JudgeJob, JudgeResult, JudgeStatus


@shared_task(name="feedback.search_index", queue="default", ignore_result=True)
def search_index(trace_ids: list[int]) -> int:
    """Build the search vectors of freshly stored traces (idempotent: a rerun rewrites them)."""
    from feedback.services.search import traces_search_index

    return traces_search_index(trace_ids=trace_ids)


@shared_task(name="feedback.judge_result_run", queue="default")
def judge_result_run_task(result_id: int) -> None:
    from feedback.services.judging import judge_run

    result = JudgeResult.objects.filter(pk=result_id).first()
    if result is not None:
        judge_run(result=result)


@shared_task(name="feedback.judge_job_run", queue="default")
def judge_job_run_task(job_id: int) -> None:
    from feedback.services.judge_jobs import judge_job_run

    job = JudgeJob.objects.filter(pk=job_id).first()
    if job is not None:
        judge_job_run(job=job)


@shared_task(name="feedback.order_swap_check", queue="default")
def order_swap_check_task(result_id: int) -> None:
    from feedback.services.judging import order_swap_check_run

    result = JudgeResult.objects.filter(pk=result_id, status=JudgeStatus.SUCCEEDED).first()
    if result is not None and not result.swap_checks.exists():
        order_swap_check_run(result=result)


@shared_task(name="feedback.failure_mode_run", queue="default")
def failure_mode_run_task(run_id: int) -> None:
    from feedback.failure_modes.services import failure_mode_run_execute

    run = FailureModeRun.objects.filter(pk=run_id).first()
    if run is not None:
        failure_mode_run_execute(run=run)


@shared_task(name="feedback.demo_agent_run", queue="default")
def demo_agent_run_task(deployment_id: int, split: str, episodes: int) -> None:
    from feedback.services.demo_runs import demo_agent_run_for
    from training.serving.models import Deployment

    deployment = Deployment.objects.filter(pk=deployment_id).first()
    if deployment is not None:
        demo_agent_run_for(deployment=deployment, split=split, episodes=episodes)
