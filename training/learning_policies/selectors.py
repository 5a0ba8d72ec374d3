"""Reading learning policies and their runs: the page's lists and the API's bodies."""

from __future__ import annotations

from typing import Any

from django.db.models import OuterRef, Prefetch, QuerySet, Subquery

from training.learning_policies.models import LearningPolicy, LearningPolicyRun

RUNS_SHOWN = 50


def _runs() -> QuerySet[LearningPolicyRun]:
    return LearningPolicyRun.objects.select_related(
        "training_set", "job", "job__result_version", "evaluation", "promotion"
    ).order_by("-fired_at", "-id")


def learning_policy_list(*, deployment_id: int | None = None) -> list[LearningPolicy]:
    """Every policy (of one deployment), each with its latest run as `latest` (two queries)."""
    newest = LearningPolicyRun.objects.filter(policy=OuterRef("pk")).order_by("-fired_at", "-id").values("pk")[:1]
    policies = LearningPolicy.objects.select_related("deployment", "created_by", "notify_group", "notify_user")
    if deployment_id is not None:
        policies = policies.filter(deployment_id=deployment_id)
    rows = list(policies.annotate(latest_run_id=Subquery(newest)).order_by("deployment__name", "name"))
    runs = _runs().in_bulk([p.latest_run_id for p in rows if p.latest_run_id])
    for p in rows:
        p.latest = runs.get(p.latest_run_id)
    return rows


def learning_policy_get(*, policy_id: int) -> LearningPolicy | None:
    """A policy with its latest `RUNS_SHOWN` runs prefetched as `recent_runs`."""
    return (
        LearningPolicy.objects.select_related(
            "deployment", "created_by", "notify_group", "notify_user", "eval_training_set"
        )
        .prefetch_related(Prefetch("runs", queryset=_runs()[:RUNS_SHOWN], to_attr="recent_runs"))
        .filter(pk=policy_id)
        .first()
    )


def run_as_dict(run: LearningPolicyRun) -> dict[str, Any]:
    return {
        "id": run.pk,
        "fired_at": run.fired_at.isoformat(),
        "reason": run.reason,
        "stage": run.stage,
        "outcome": run.outcome,
        "training_set": run.training_set_id,
        "provenance": run.provenance,
        "job": run.job_id,
        "job_status": run.job.status if run.job_id else None,
        "candidate": run.job.result_version.name if run.job_id and run.job.result_version_id else None,
        "evaluation": run.evaluation_id,
        "evaluation_status": run.evaluation.status if run.evaluation_id else None,
        "promotion": run.promotion_id,
        "promotion_status": run.promotion.status if run.promotion_id else None,
        "checks": run.checks,
        "error": run.error,
        "notified": run.notified,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
    }


def policy_as_dict(policy: LearningPolicy, *, runs: list[LearningPolicyRun] | None = None) -> dict[str, Any]:
    out = {
        "id": policy.pk,
        "deployment": policy.deployment.name,
        "name": policy.name,
        "enabled": policy.enabled,
        "signal": policy.signal,
        "environment": policy.environment,
        "min_new_turns": policy.min_new_turns,
        "min_interval_minutes": policy.min_interval_minutes,
        "job_kind": policy.job_kind,
        "job_config": policy.job_config,
        "heldout_fraction": policy.heldout_fraction,
        "eval_training_set": policy.eval_training_set_id,
        "eval_environment": policy.eval_environment,
        "eval_environment_split": policy.eval_environment_split,
        "eval_environment_tasks": policy.eval_environment_tasks,
        "min_win_rate": policy.min_win_rate,
        "min_win_rate_ci_low": policy.min_win_rate_ci_low,
        "require_no_regressions": policy.require_no_regressions,
        "require_monitors_clean": policy.require_monitors_clean,
        "notify_group": policy.notify_group.name if policy.notify_group_id else None,
        "notify_user": policy.notify_user.username if policy.notify_user_id else None,
        "waiting_reason": policy.waiting_reason,
        "checked_at": policy.checked_at.isoformat() if policy.checked_at else None,
        "created_by": policy.created_by.username,
        "created_at": policy.created_at.isoformat(),
        "updated_at": policy.updated_at.isoformat(),
    }
    if runs is not None:
        out["runs"] = [run_as_dict(r) for r in runs]
    return out
