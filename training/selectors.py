"""Reads for models, versions, live pointers and the training pages."""

from __future__ import annotations

from statistics import median

from django.db.models import QuerySet

from training.models import JobEventKind, LiveVersion, ModelVersion, TrainingJob, TrainingJobEvent, TrainingSet


def live_version_get(*, deployment_id: int) -> ModelVersion | None:
    """The version a deployment serves now, with its base model, or None."""
    live = LiveVersion.objects.select_related("version__base_model").filter(deployment_id=deployment_id).first()
    return live.version if live else None


def live_versions_for_base(*, base_model_id: int) -> list[ModelVersion]:
    """The distinct versions over one base model that some deployment serves now."""
    return list(
        ModelVersion.objects.filter(base_model_id=base_model_id, live_for__isnull=False)
        .select_related("base_model")
        .distinct()
    )


CHARTS = [
    ("reward_mean", "Reward (mean ± std)"),
    ("kl", "KL to the starting model"),
    ("loss", "Loss"),
    ("response_length", "Response length (tokens)"),
    ("zero_variance_share", "Zero-variance groups (share)"),
]
# Environment fidelity, for episode jobs: a reward that rises with these is suspect.
EPISODE_CHARTS = [
    ("success", "Task success (training episodes)"),
    ("tool_error_rate", "Tool-error rate per episode"),
    ("budget_exhaustion", "Budget exhausted (share of episodes)"),
    ("early_stop", "Early stops (share of episodes)"),
]


def job_charts(*, job: TrainingJob) -> list[tuple[str, str]]:
    """The (metric, title) charts of a job's page."""
    return CHARTS + EPISODE_CHARTS if job.kind == "episodes" else CHARTS


def training_job_list(*, limit: int = 50) -> QuerySet[TrainingJob]:
    return TrainingJob.objects.select_related("base_version", "training_set", "result_version", "created_by")[:limit]


def training_job_get(*, job_id: int) -> TrainingJob | None:
    return (
        TrainingJob.objects.select_related("base_version", "training_set", "result_version", "created_by")
        .filter(pk=job_id)
        .first()
    )


def job_step_series(*, job: TrainingJob) -> dict[str, list]:
    """Per metric, the (step, value) points of the job's steps, the latest value of a
    step winning (steps redone after a resume appear once)."""
    by_step: dict[int, dict] = {}
    for step, data in TrainingJobEvent.objects.filter(job=job, kind=JobEventKind.STEP).values_list("step", "data"):
        by_step[step] = data
    steps = sorted(by_step)
    series: dict[str, list] = {}
    for key, _ in CHARTS + EPISODE_CHARTS:
        series[key] = [(s, by_step[s][key]) for s in steps if by_step[s].get(key) is not None]
    series["reward_band"] = [
        (s, by_step[s]["reward_mean"] - by_step[s]["reward_std"], by_step[s]["reward_mean"] + by_step[s]["reward_std"])
        for s in steps
        if by_step[s].get("reward_mean") is not None and by_step[s].get("reward_std") is not None
    ]
    series["step_seconds"] = [by_step[s].get("step_seconds") for s in steps if by_step[s].get("step_seconds")]
    return series


def job_eta_seconds(*, job: TrainingJob, step_seconds: list[float]) -> float | None:
    """Remaining steps x the median of the last 10 step times; None before the first step."""
    if not job.is_active or not step_seconds or not job.total_steps:
        return None
    return max(0, job.total_steps - job.step) * median(step_seconds[-10:])


def job_evals(*, job: TrainingJob) -> list[TrainingJobEvent]:
    return list(TrainingJobEvent.objects.filter(job=job, kind=JobEventKind.EVAL).order_by("id"))


def job_logs(*, job: TrainingJob, limit: int = 200) -> list[TrainingJobEvent]:
    rows = TrainingJobEvent.objects.filter(job=job, kind__in=[JobEventKind.LOG, JobEventKind.BREACH]).order_by("-id")
    return list(reversed(rows[:limit]))


def job_sample_steps(*, job: TrainingJob) -> list[int]:
    return sorted(
        set(TrainingJobEvent.objects.filter(job=job, kind=JobEventKind.SAMPLE).values_list("step", flat=True))
    )


def job_samples(*, job: TrainingJob, step: int | None) -> list[dict]:
    rows = TrainingJobEvent.objects.filter(job=job, kind=JobEventKind.SAMPLE)
    if step is not None:
        rows = rows.filter(step=step)
    event = rows.order_by("-id").first()
    return event.data.get("rows", []) if event else []


def versions_to_train_from() -> QuerySet[ModelVersion]:
    return ModelVersion.objects.select_related("base_model").exclude(status="failed")


def training_sets() -> QuerySet[TrainingSet]:
    return TrainingSet.objects.all()[:100]
