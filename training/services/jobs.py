"""Training jobs, web side: create, cancel, and the periodic check of stale heartbeats.

Nothing here imports torch: the worker side lives in `training.services.job_runner`."""

from __future__ import annotations

import math
from datetime import datetime

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from training.inference.client import server_root
from training.models import (
    CorrectionSource,
    JobEventKind,
    JobKind,
    TrainingItemKind,
    TrainingJob,
    TrainingJobEvent,
    TrainingSet,
)
from training.services.gap_probes import hint_gap_verdict
from training.services.judge_gate import JudgeGateClosed, judge_gate_pass
from training.serving.models import Deployment, ModelVersion, ModelVersionKind
from training.serving.selectors import base_model_replica_urls
from training.tasks import training_job_run_task
from training.trainer.config import ConfigError, config_from_dict
from webapp.kernel.errors import Invalid
from webapp.kernel.stale_work import stale_work_settle
from webapp.kernel.work import WorkStatus, work_cancel


class JobError(Invalid, ValueError):
    """A job request that cannot be honoured; `errors` lists (field, reason) pairs."""

    def __init__(self, errors: list[tuple[str, str]]):
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors), errors=errors)


def model_paths(version: ModelVersion) -> dict[str, str]:
    """Where the weights of `version` are, as config fields: a LoRA version trains on as
    an adapter over its base model; a base or full version is the model itself."""
    if version.kind == ModelVersionKind.LORA:
        return {"model_path": version.base_model.path, "init_adapter": version.path}
    return {"model_path": version.path, "init_adapter": ""}


def rollout_urls_allowed(*, base_model) -> list[str]:
    """The servers a job over `base_model` may sample rollouts from, as base URLs ending
    in /v1: the base model's own inference servers first (its `inference_url`, else
    PRACTICUM_INFERENCE_URL, then its replicas), then PRACTICUM_INFERENCE_ROLLOUT_URLS."""
    roots = [*base_model_replica_urls(base=base_model), *settings.INFERENCE_ROLLOUT_URLS]
    out: list[str] = []
    for root in roots:
        url = server_root(root) + "/v1"
        if url not in out:
            out.append(url)
    return out


def rollout_url_resolve(*, base_model, requested: str) -> str:
    """The rollout server for a job: `requested` when it is one of the configured servers
    (`rollout_urls_allowed`), the base model's own when blank. A job config never points a
    worker at any other URL (the worker sends the inference server's key there and loads
    what it answers). Raises `JobError` naming `config.vllm_url`."""
    allowed = rollout_urls_allowed(base_model=base_model)
    if not requested.strip():
        return allowed[0]
    wanted = server_root(requested) + "/v1"
    if wanted not in allowed:
        raise JobError(
            [
                (
                    "config.vllm_url",
                    f"must be the base model's inference server ({allowed[0]})"
                    + (f" or one of PRACTICUM_INFERENCE_ROLLOUT_URLS ({', '.join(allowed[1:])})" if allowed[1:] else "")
                    + "; leave it out to use the base model's",
                )
            ]
        )
    return wanted


def training_job_config_check(*, kind: str, config: dict, base_version: ModelVersion):
    """The typed config a job of `kind` from `base_version` would run with, or `JobError`
    naming each bad field (`kind`, `config.<field>`). The jobs page, the jobs API and the
    learning policies' recipes all validate through here."""
    if kind not in JobKind.values:
        raise JobError([("kind", f"must be one of {', '.join(JobKind.values)}")])
    if not isinstance(config, dict):
        raise JobError([("config", "must be an object")])
    unstorable = _unstorable(config, "config")
    if unstorable:
        raise JobError(unstorable)
    forbidden = [k for k in ("model_path", "init_adapter", "kind") if k in config]
    if forbidden:
        raise JobError([(f"config.{k}", "is set from the base version and kind") for k in forbidden])
    data = {**config, **model_paths(base_version), "kind": kind}
    if data.get("rollout") == "vllm" or data.get("vllm_url"):
        if not isinstance(data.get("vllm_url", ""), str):
            raise JobError([("config.vllm_url", "must be a string")])
        data["vllm_url"] = rollout_url_resolve(base_model=base_version.base_model, requested=data.get("vllm_url", ""))
    if base_version.kind == ModelVersionKind.LORA and data.get("adapter", "lora") != "lora":
        raise JobError([("config.adapter", "a LoRA version trains on as LoRA")])
    try:
        return config_from_dict(data)
    except ConfigError as exc:
        raise JobError([(f"config.{f}", r) for f, r in exc.errors]) from None


def _unstorable(value, path: str) -> list[tuple[str, str]]:
    """The places in a config that a jsonb column cannot hold: a NUL character in a key or a
    string, a NaN or infinite number (`1e999` reads as infinity). Walked without recursion."""
    errors: list[tuple[str, str]] = []
    stack = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                if isinstance(k, str) and "\x00" in k:
                    errors.append((where, "a key contains a NUL character"))
                else:
                    stack.append((v, f"{where}.{k}"))
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
        elif isinstance(item, str) and "\x00" in item:
            errors.append((where, "contains a NUL character"))
        elif isinstance(item, float) and not math.isfinite(item):
            errors.append((where, "must be a finite number"))
    return sorted(errors)


@transaction.atomic
def training_job_create(
    *,
    kind: str,
    config: dict,
    base_version: ModelVersion,
    training_set: TrainingSet | None,
    user=None,
    deployment=None,
    enqueue: bool = True,
    judge_gate_override_reason: str = "",
) -> TrainingJob:
    """Validate the config, store a queued job, and enqueue it once the row is committed
    (`enqueue=False` for a script that runs the job in its own process).

    The model paths come from `base_version`, never from the request. An "episodes" job
    takes its tasks from its environment and needs no training set; its episodes are
    recorded as traces of `deployment` (default: the training set's, else the version's).
    A job whose rewards the judge scores needs the judge's training gate open, or
    `judge_gate_override_reason` from `user` (audited)."""
    parsed = training_job_config_check(kind=kind, config=config, base_version=base_version)
    if training_set is None and kind != JobKind.EPISODES:
        raise JobError([("training_set", "choose a training set")])
    if training_set is not None and kind != JobKind.EPISODES:
        _check_items(kind, training_set, hint_samples=getattr(parsed, "hint_samples", 0))
    if kind == JobKind.EPISODES and parsed.rollout == "vllm" and parsed.adapter != "lora":
        raise JobError([("config.rollout", "vLLM rollouts need a LoRA adapter")])
    hint_note = _hint_gap_pass(kind, parsed, base_version)
    deployment = deployment or (training_set.deployment if training_set else None) or base_version.deployment
    gate = _gate_pass(kind, parsed, training_set, deployment, user, judge_gate_override_reason)
    job = TrainingJob.objects.create(
        kind=kind,
        config=parsed.to_dict(),
        training_set=training_set,
        base_version=base_version,
        deployment=deployment,
        total_steps=parsed.steps,
        created_by=user,
    )
    _gate_log(job, gate)
    if hint_note:
        _log(job, hint_note)
    _log(job, "queued")
    if enqueue:
        _enqueue(job)
    return job


def _hint_gap_pass(kind: str, parsed, base_version: ModelVersion) -> str:
    """What the job's log says about the version's student-teacher gap ("" for a job that
    uses no hint); `JobError` on the base version when the gap is too small."""
    allowed, said = hint_gap_verdict(kind=kind, config=parsed, version=base_version)
    if not allowed:
        raise JobError([("base_version", said)])
    return said


def _gate_pass(kind: str, parsed, training_set, deployment, user, override_reason: str) -> dict | None:
    """The judge's training gate, for a job that trains on what the judge wrote (None when
    it does not); `JobError` when the gate is closed and not overridden."""
    uses = _judge_scored(kind, parsed, training_set)
    if not uses:
        return None

    try:
        return judge_gate_pass(
            deployments=[deployment],
            uses=uses,
            override_reason=override_reason,
            user=user,
            audit_on=_trained_on(training_set),
        )
    except JudgeGateClosed as exc:
        raise JobError([(exc.field, exc.reason)]) from None


def _gate_log(job: TrainingJob, gate: dict | None) -> None:
    if gate is None:
        return
    override = gate["override"]
    said = (
        f"judge gate overridden by {override['by']}: {override['reason']}"
        if override
        else "judge gate open: " + "; ".join(g["reason"] for g in gate["gates"])
    )
    TrainingJobEvent.objects.create(job=job, kind=JobEventKind.LOG, step=0, data={"message": said, "judge_gate": gate})


# A job whose training set is built off the request path (a fine-tuning request's files are
# read by a worker) is stored queued without its set and enqueued only once it has one.
AWAITING_SET_PHASE = "validating_files"


@transaction.atomic
def training_job_hold(*, kind: str, config: dict, base_version: ModelVersion, deployment, message: str) -> TrainingJob:
    """A queued job whose training set is still to be built: its config is checked now, the
    set's checks wait for `training_job_set_attach`, and nothing is enqueued until then (a
    cancel before that ends it at once, as any queued job)."""
    if kind == JobKind.EPISODES:
        raise JobError([("kind", "an episodes job needs no training set")])
    parsed = training_job_config_check(kind=kind, config=config, base_version=base_version)
    job = TrainingJob.objects.create(
        kind=kind,
        config=parsed.to_dict(),
        base_version=base_version,
        deployment=deployment,
        phase={"name": AWAITING_SET_PHASE, "done": 0, "total": 0, "since": timezone.now().isoformat()},
    )
    _log(job, message)
    return job


def training_job_awaits_set(job: TrainingJob) -> bool:
    return job.status == WorkStatus.QUEUED and job.training_set_id is None and job.kind != JobKind.EPISODES


@transaction.atomic
def training_job_set_attach(
    *, job_id: int, training_set: TrainingSet, config: dict, enqueue: bool = True
) -> TrainingJob | None:
    """Give a held job its training set and final config, with every check a new job gets
    (the judge's gate included), and enqueue it. None when the job no longer waits for one
    (cancelled meanwhile, or given one by an earlier delivery)."""
    job = TrainingJob.objects.select_for_update().select_related("base_version").filter(pk=job_id).first()
    if job is None or not training_job_awaits_set(job):
        return None
    parsed = training_job_config_check(kind=job.kind, config=config, base_version=job.base_version)
    _check_items(job.kind, training_set, hint_samples=getattr(parsed, "hint_samples", 0))
    hint_note = _hint_gap_pass(job.kind, parsed, job.base_version)
    gate = _gate_pass(job.kind, parsed, training_set, job.deployment, None, "")
    job.training_set, job.config, job.total_steps = training_set, parsed.to_dict(), parsed.steps
    job.phase = {}
    job.save(update_fields=["training_set", "config", "total_steps", "phase"])
    _gate_log(job, gate)
    if hint_note:
        _log(job, hint_note)
    _log(job, "queued")
    if enqueue:
        _enqueue(job)
    return job


@transaction.atomic
def training_job_refuse(*, job_id: int, reason: str) -> TrainingJob | None:
    """Fail a held job whose training set could not be built, saying why (None when it no
    longer waits for one)."""
    job = TrainingJob.objects.select_for_update().filter(pk=job_id).first()
    if job is None or not training_job_awaits_set(job):
        return None
    job.status, job.error, job.finished_at, job.phase = WorkStatus.FAILED, reason, timezone.now(), {}
    job.save(update_fields=["status", "error", "finished_at", "phase"])
    _log(job, f"failed: {reason}")
    return job


def _trained_on(training_set: TrainingSet | None) -> list:
    """The deployments whose conversations a set's items come from (where an override of the
    settings' judge is audited)."""
    if training_set is None:
        return []
    traces = training_set.items.filter(trace__isnull=False).values("trace__deployment")
    return list(Deployment.objects.filter(pk__in=traces).order_by("name"))


def _judge_scored(kind: str, config, training_set: TrainingSet | None) -> str:
    """What of the judge's this job would train on ("" when nothing): its scores (GRPO
    turns without a grader, episodes with a judge weight), or its written corrections as
    SFT targets in a set that passed no gate when it was built (an older set)."""
    if (
        kind == JobKind.GRPO
        and training_set is not None
        and training_set.items.filter(kind=TrainingItemKind.TURN, grader="").exists()
    ):
        return "a GRPO job rewarded by the judge"
    if kind == JobKind.EPISODES and getattr(config, "judge_weight", 0) > 0:
        return "an episodes job rewarded partly by the judge"
    if (
        kind == JobKind.SFT
        and training_set is not None
        and "judge_gate" not in (training_set.selection or {})
        and training_set.items.filter(split="train", correction_source=CorrectionSource.JUDGE).exists()
    ):
        return "an SFT job on the judge's corrections"
    return ""


def _check_items(kind: str, training_set: TrainingSet, *, hint_samples: int = 0) -> None:
    items = training_set.items.filter(split="train")
    if not items.exists():
        held = (training_set.selection or {}).get("held_out_for_evaluation_slices")
        why = f": its {held} turns on failure modes' evaluation slices are held out, the slices' test" if held else ""
        raise JobError([("training_set", f"has no training items{why}")])
    if kind == JobKind.SFT and not items.exclude(corrected_response="").exists():
        raise JobError([("training_set", "has no corrected responses to fine-tune on")])
    if kind == JobKind.DISTILL and not items.exclude(feedback="").exists():
        raise JobError([("training_set", "has no feedback to use as a hint")])
    if kind == JobKind.GRPO:
        ungraded = items.filter(kind=TrainingItemKind.TASK, grader="")
        if ungraded.exists():
            raise JobError([("training_set", "has tasks without a grader")])
        unscorable = items.filter(kind=TrainingItemKind.TURN, rubric__isnull=True, feedback="")
        if unscorable.exists():
            raise JobError([("training_set", "has turns with neither a judge rubric nor feedback to score against")])
        # As `hints.hint_groups`: a comment of only whitespace is no hint.
        if hint_samples > 0 and not items.filter(feedback__regex=r"\S").exists():
            raise JobError(
                [("config.hint_samples", "the training set has no feedback to use as a hint (0 = plain GRPO)")]
            )


def _enqueue(job: TrainingJob) -> None:
    training_job_run_task.delay_on_commit(job.pk)


def training_job_cancel(*, job: TrainingJob, user=None) -> TrainingJob:
    """A queued job is cancelled at once; a running one gets a flag that its loop reads
    before the next step (it checkpoints, then stops)."""
    who = getattr(user, "username", "") or "someone"
    return (
        work_cancel(
            TrainingJob,
            pk=job.pk,
            on_end=lambda row: _log(row, f"cancelled by {who} before it started"),
            on_asked=lambda row: _log(row, f"cancel requested by {who}; stopping after the current step"),
        )
        or job
    )


def training_jobs_check_stale(*, now: datetime | None = None) -> list[tuple[int, str]]:
    """Find running jobs whose worker stopped sending heartbeats. Each is re-queued to
    resume from its last checkpoint, or marked failed after too many attempts — never
    left "running". A job that was being cancelled is marked cancelled."""
    now = now or timezone.now()

    def silent(job: TrainingJob) -> str:
        return f"worker silent for {int((now - (job.heartbeat_at or job.started_at)).total_seconds())} s"

    def ended(job: TrainingJob) -> None:
        _log(
            job,
            f"{silent(job)} while cancelling; marked cancelled" if job.status == WorkStatus.CANCELLED else job.error,
        )

    def requeued(job: TrainingJob) -> None:
        where = f"checkpoint at step {job.checkpoint_step}" if job.checkpoint_path else "the start"
        _log(job, f"{silent(job)}; re-queued to resume from {where}")
        _enqueue(job)

    return stale_work_settle(
        TrainingJob,
        silent_after=settings.TRAINING_STALE_AFTER_SECONDS,
        now=now,
        what="training job's heartbeats",
        on_end=ended,
        resume=lambda job: job.attempts < settings.TRAINING_MAX_ATTEMPTS,
        on_resumed=requeued,
    )


def _log(job: TrainingJob, message: str) -> None:
    TrainingJobEvent.objects.create(job=job, kind=JobEventKind.LOG, step=job.step, data={"message": message})
