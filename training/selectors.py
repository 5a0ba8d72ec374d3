"""Reads for the training pages."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from statistics import median
from typing import Any

from django.db.models import Q, QuerySet

from training.charts import chart_spec
from training.models import (
    PHASE_LABELS,
    GapProbe,
    JobEventKind,
    JobKind,
    TrainingItem,
    TrainingItemKind,
    TrainingJob,
    TrainingJobEvent,
    TrainingSet,
)
from training.services.gap_probes import HINT_PLACEMENTS, hint_offer
from training.serving.models import LiveVersion, ModelVersion

CHARTS = [
    ("reward_mean", "Reward (mean ± std)"),
    ("kl", "KL to the starting model"),
    ("loss", "Loss"),
    ("response_length", "Response length (tokens)"),
    ("zero_variance_share", "Zero-variance groups (share)"),
]
# What each method can measure: SFT and self-distillation have no reward, no groups and no
# KL to the starting model (distillation's loss is the KL to the hinted teacher), so their
# pages do not draw empty charts for them.
METHOD_CHARTS = {
    "grpo": ("reward_mean", "kl", "loss", "response_length", "zero_variance_share"),
    "episodes": ("reward_mean", "kl", "loss", "response_length", "zero_variance_share"),
    "distill": ("loss", "response_length"),
    "sft": ("loss", "response_length"),
}
CHART_TITLES = {"distill": {"loss": "Loss: KL(student ‖ hinted teacher)"}}
# Environment fidelity, for episode jobs: a reward that rises with these is suspect.
EPISODE_CHARTS = [
    ("success", "Task success (training episodes)"),
    ("tool_error_rate", "Tool-error rate per episode"),
    ("budget_exhaustion", "Budget exhausted (share of episodes)"),
    ("early_stop", "Early stops (share of episodes)"),
]


# Hinted GRPO (a GRPO job with hint_samples > 0): what the comments did to the groups
# that had no reward variance.
HINT_CHARTS = [
    ("hinted_groups", "Groups with one reward and a comment (hinted)"),
    ("hinted_groups_with_variance", "Hinted groups that gained reward variance"),
    ("hint_weight_mean", "Importance weight of hinted tokens (mean)"),
    ("hint_truncated_share", "Hinted tokens at the weight's cap (share)"),
]
# Logged with them, served by the metrics API, not drawn.
HINT_SERIES = ["zero_variance_groups", "hint_reward_mean"]


def job_charts(*, job: TrainingJob) -> list[tuple[str, str]]:
    """The (metric, title) charts of a job's page: only those its method can have data for."""
    keep = METHOD_CHARTS.get(job.kind, tuple(k for k, _ in CHARTS))
    titles = CHART_TITLES.get(job.kind, {})
    charts = [(key, titles.get(key, title)) for key, title in CHARTS if key in keep]
    if job.kind == "grpo" and (job.config or {}).get("hint_samples"):
        charts += HINT_CHARTS
    return charts + EPISODE_CHARTS if job.kind == "episodes" else charts


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
    at: dict[int, datetime] = {}
    for step, data, created in TrainingJobEvent.objects.filter(job=job, kind=JobEventKind.STEP).values_list(
        "step", "data", "created_at"
    ):
        by_step[step], at[step] = data, created
    steps = sorted(by_step)
    series: dict[str, list] = {}
    for key in [k for k, _ in CHARTS + EPISODE_CHARTS + HINT_CHARTS] + HINT_SERIES:
        series[key] = [(s, by_step[s][key]) for s in steps if by_step[s].get(key) is not None]
    series["reward_band"] = [
        (s, by_step[s]["reward_mean"] - by_step[s]["reward_std"], by_step[s]["reward_mean"] + by_step[s]["reward_std"])
        for s in steps
        if by_step[s].get("reward_mean") is not None and by_step[s].get("reward_std") is not None
    ]
    series["step_seconds"] = [by_step[s].get("step_seconds") for s in steps if by_step[s].get("step_seconds")]
    # When each step was logged, in seconds since the job started: the charts' hover says it.
    start = job.started_at or (min(at.values()) if at else None)
    series["elapsed"] = [(s, round((at[s] - start).total_seconds(), 1)) for s in steps] if start else []
    return series


@dataclass(frozen=True)
class JobProgress:
    """What a job's page says about its progress: the phase with its own progress, the share
    of the whole job done (never 100% while it still works), and the time left."""

    phase: str  # a key of PHASE_LABELS
    label: str
    phase_done: int
    phase_total: int
    percent: int
    eta_seconds: float | None
    eta_note: str  # what the estimate counts, or why there is none yet
    evaluations_left: int

    @property
    def phase_percent(self) -> int | None:
        return round(100 * self.phase_done / self.phase_total) if self.phase_total else None


def job_evaluates(job: TrainingJob) -> bool:
    """Whether the job has anything to evaluate on: held-out items of its set (for SFT and
    self-distillation, held-out items with a grader: they measure compliance by one), or
    canary prompts. An episodes job evaluates on its environment's tasks."""
    if job.kind == JobKind.EPISODES or job.training_set_id is None or (job.config or {}).get("canaries"):
        return True
    if not job.training_set.heldout_count:
        return False
    if job.kind == JobKind.GRPO:
        return True
    return job.training_set.items.filter(split="heldout").exclude(grader="").exists()


def _evaluations_left(job: TrainingJob, *, evaluating: bool) -> int:
    """Evaluations still to run after the current step (the loops evaluate every `eval_every`
    steps and at the last step), plus the one running now; none for a job with nothing to
    evaluate on."""
    if not evaluating and not job_evaluates(job):
        return 0
    every = int((job.config or {}).get("eval_every") or 0)
    if not every or not job.total_steps:
        return int(evaluating)
    later = [s for s in range(job.step + 1, job.total_steps + 1) if s % every == 0 or s == job.total_steps]
    return len(later) + int(evaluating)


def job_progress(*, job: TrainingJob, step_seconds: list[float], eval_seconds: list[float]) -> JobProgress:
    """Remaining time = steps left x the median of the last 10 step times + evaluations left x
    the median evaluation time (the one running counted by its share left). No estimate
    before a step and an evaluation have been timed when both are still to come."""
    phase = dict(job.phase or {})
    name = phase.get("name") or ("queued" if job.status == "queued" else "sampling" if job.step else "loading")
    if not job.is_active:
        name = "done"
    done, total = int(phase.get("done") or 0), int(phase.get("total") or 0)
    percent = round(100 * job.progress)
    if job.is_active:
        percent = min(percent, 99)  # the last step done is not the job done: evaluation, export …
    if not job.is_active:
        return JobProgress(name, PHASE_LABELS["done"], 1, 1, percent, None, "", 0)
    evaluating = name == "evaluation"
    evals_left = _evaluations_left(job, evaluating=evaluating)
    steps_left = max(0, job.total_steps - job.step)
    step_time = median(step_seconds[-10:]) if step_seconds else None
    eval_time = median(eval_seconds[-10:]) if eval_seconds else None
    label = PHASE_LABELS.get(name, name)
    if name in ("export", "registration"):
        return JobProgress(name, label, done, total, percent, None, "finishing: no steps or evaluations left", 0)
    missing = []
    if steps_left and step_time is None:
        missing.append("the first step")
    if evals_left and eval_time is None:
        missing.append("the first evaluation")
    if missing:
        return JobProgress(
            name, label, done, total, percent, None, f"estimated after {' and '.join(missing)}", evals_left
        )
    eta = steps_left * (step_time or 0.0)
    if evals_left:
        running_share = (1 - done / total) if evaluating and total else (1.0 if evaluating else 0.0)
        eta += ((evals_left - int(evaluating)) + running_share) * (eval_time or 0.0)
    steps = f"{steps_left} step{'s' if steps_left != 1 else ''}"
    note = f"{steps} and {evals_left} evaluation{'s' if evals_left != 1 else ''}"
    if not evals_left and not evaluating and not job_evaluates(job):
        note = f"{steps}; nothing held out to evaluate on"
    return JobProgress(name, label, done, total, percent, eta, note, evals_left)


def job_live(*, job: TrainingJob) -> tuple[dict[str, list], list[TrainingJobEvent], JobProgress]:
    """What a job's page and its API show as it goes: the step series, the in-job
    evaluations and the progress they give."""
    series = job_step_series(job=job)
    evals = job_evals(job=job)
    progress = job_progress(job=job, step_seconds=series["step_seconds"], eval_seconds=job_eval_seconds(evals=evals))
    return series, evals, progress


def job_eval_seconds(*, evals: list[TrainingJobEvent]) -> list[float]:
    return [float(e.data["eval_seconds"]) for e in evals if e.data.get("eval_seconds")]


def job_evals(*, job: TrainingJob) -> list[TrainingJobEvent]:
    return list(TrainingJobEvent.objects.filter(job=job, kind=JobEventKind.EVAL).order_by("id"))


CHECKPOINT_LOG = "checkpoint at step "  # how the job runner logs a checkpoint it saved
# Metrics an in-job evaluation measures on held-out items, drawn beside the training line.
VALIDATION_OF = {"reward_mean": "reward", "response_length": "response_length"}
PERCENT_METRICS = {"zero_variance_share", "success", "tool_error_rate", "budget_exhaustion", "early_stop"}


def job_checkpoint_steps(*, job: TrainingJob) -> list[int]:
    """The steps the job saved a checkpoint at (from its log)."""
    messages = TrainingJobEvent.objects.filter(
        job=job, kind=JobEventKind.LOG, data__message__startswith=CHECKPOINT_LOG
    ).values_list("step", flat=True)
    return sorted(set(messages))


def job_chart_specs(
    *, job: TrainingJob, series: dict[str, list], evals: list[TrainingJobEvent], checkpoints: list[int]
) -> list[dict[str, Any]]:
    """The job page's charts (see training.charts.chart_spec): each metric its method can have,
    per step, with the held-out evaluations' line where they measure it (reward, response
    length; step 0 is the starting model), the mean ± std band of the reward, and the steps
    with a checkpoint marked."""
    elapsed = {str(s): seconds for s, seconds in series.get("elapsed", [])}
    markers = [{"x": float(s), "label": f"checkpoint {s}"} for s in checkpoints]
    specs = []
    for key, title in job_charts(job=job):
        lines: list[dict[str, Any]] = [
            {
                "label": "training",
                "points": series.get(key, []),
                **({"band": series["reward_band"]} if key == "reward_mean" else {}),
            }
        ]
        measured = VALIDATION_OF.get(key)
        if measured:
            held_out = [(e.step, e.data.get(measured)) for e in evals if e.data.get(measured) is not None]
            if held_out:
                lines.append({"label": "validation (held out)", "points": held_out, "dash": True})
        specs.append(
            chart_spec(
                chart_id=f"chart-{key}",
                title=title,
                series=lines,
                x={"label": "step", "kind": "step", "elapsed": elapsed, "range": (0, max(job.total_steps, 1))},
                y={"label": title.split(" (")[0], "format": "percent" if key in PERCENT_METRICS else "number"},
                markers=markers,
            )
        )
    return specs


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


# Fewer usable items than this and the job form warns: every step repeats the same few.
FEW_USABLE = 5
USABLE_WHAT = {
    JobKind.GRPO: "with a grader, a judge rubric or feedback to score against",
    JobKind.DISTILL: "with feedback to use as a hint",
    JobKind.SFT: "with a corrected response",
}


@dataclass(frozen=True)
class Usable:
    """How many of a set's training items a method can train on."""

    kind: str
    usable: int
    total: int

    @property
    def few(self) -> bool:
        return self.usable < min(FEW_USABLE, self.total) or self.usable == 0

    def sentence(self) -> str:
        label = JobKind(self.kind).label
        return f"{self.usable} of {self.total} items usable by {label} (those {USABLE_WHAT[JobKind(self.kind)]})"


def training_set_usable(*, kind: str, training_set: TrainingSet | None) -> Usable | None:
    """The training items of `training_set` that a `kind` job trains on (the filters its
    trainer applies: SFT needs a corrected response, self-distillation a hint, GRPO something
    to score against); None for a method that takes no set's items (episodes)."""
    if training_set is None or kind not in USABLE_WHAT:
        return None
    items = TrainingItem.objects.filter(training_set=training_set, split="train")
    if kind == JobKind.SFT:
        usable = items.exclude(corrected_response="")
    elif kind == JobKind.DISTILL:
        usable = items.filter(feedback__regex=r"\S")
    else:
        usable = items.filter(
            Q(kind=TrainingItemKind.TASK) & ~Q(grader="")
            | Q(kind=TrainingItemKind.TURN) & (Q(rubric__isnull=False) | Q(feedback__regex=r"\S"))
        )
    return Usable(kind=kind, usable=usable.count(), total=training_set.train_count)


def live_version_to_train_from(*, training_set: TrainingSet | None) -> ModelVersion | None:
    """The version a new job starts from by default: the live version of the set's
    deployment, else of the first deployment (by name) that has one."""
    live = LiveVersion.objects.select_related("version").order_by("deployment__name")
    if training_set is not None and training_set.deployment_id is not None:
        own = live.filter(deployment_id=training_set.deployment_id).first()
        if own is not None:
            return own.version
    first = live.exclude(version__status="failed").first()
    return first.version if first is not None else None


def live_version_names() -> dict[int, str]:
    """Each live version's id → the deployments it is live for, for the version dropdown."""
    out: dict[int, str] = {}
    for version_id, name in LiveVersion.objects.order_by("deployment__name").values_list(
        "version_id", "deployment__name"
    ):
        out[version_id] = f"{out[version_id]}, {name}" if version_id in out else name
    return out


def versions_to_train_from() -> QuerySet[ModelVersion]:
    return ModelVersion.objects.select_related("base_model").exclude(status="failed")


def versions_with_gaps() -> list[ModelVersion]:
    """The versions to train from, each with `gap_probe` (its latest student-teacher gap
    probe, or None), `hint_refused` ((placement, `HintOffer`) for each placement of the comment
    at which distillation and hinted GRPO are not offered) and `hint_offered` (none refused)."""

    versions = list(versions_to_train_from())
    probes: dict[int, list[GapProbe]] = {}
    for probe in GapProbe.objects.filter(version__in=[v.pk for v in versions]).order_by("-created_at", "-id"):
        probes.setdefault(probe.version_id, []).append(probe)
    for v in versions:
        mine = probes.get(v.pk, [])
        v.gap_probe = mine[0] if mine else None
        # Per placement, the same rule the job check applies (`hint_offer`).
        v.hint_refused = [
            (at, offer) for at in HINT_PLACEMENTS if not (offer := hint_offer(probes=mine, hint_at=at)).offered
        ]
        v.hint_offered = not v.hint_refused
    return versions


def training_sets() -> QuerySet[TrainingSet]:
    return TrainingSet.objects.all()[:100]


def training_set_get(*, set_id: int) -> TrainingSet | None:
    return (
        TrainingSet.objects.select_related("deployment", "created_by", "failure_cluster", "failure_cluster__run")
        .filter(pk=set_id)
        .first()
    )


def training_set_items(*, training_set: TrainingSet, limit: int = 200) -> list[TrainingItem]:
    """The set's first items, each with `preview`: the text of the last message before its
    turn (what the turn answers)."""
    items = list(
        TrainingItem.objects.filter(training_set=training_set)
        .only("id", "key", "split", "kind", "trace_id", "messages", "feedback", "rubric", "reward", "grader")
        .order_by("id")[:limit]
    )
    for item in items:
        last = item.messages[-1] if isinstance(item.messages, list) and item.messages else {}
        content = last.get("content") if isinstance(last, dict) else None
        if isinstance(content, list):  # content parts: their text
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        item.preview = content if isinstance(content, str) else ""
    return items
