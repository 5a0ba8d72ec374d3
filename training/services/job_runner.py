"""Training jobs, worker side: claim the row, run the loop with callbacks that write
progress, heartbeat, metrics, samples and breaches, then register the candidate.

Imported only by workers (torch is imported inside the functions that train); the entry
point, which runs a job here or in torchrun's processes, is `job_start.training_job_run`."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import traceback
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from django.utils.text import slugify

from training.environments.base import environment_get
from training.inference.codec import message_served_text
from training.models import (
    PHASE_LABELS,
    JobEventKind,
    JobKind,
    TrainingItem,
    TrainingJob,
    TrainingJobEvent,
    TrainingSet,
    TrainingSplit,
)
from training.services.episodes import episodes_record
from training.services.job_scoring import episode_judge, scorer_for
from training.services.jobs import rollout_url_resolve
from training.serving.models import ModelVersion, ModelVersionKind
from training.serving.services import model_folder_claim, model_version_create, model_version_name_free
from training.trainer.config import config_from_dict
from training.trainer.items import TurnItem
from webapp.kernel.nul import strip_nul
from webapp.kernel.work import WorkStatus, work_beat, work_claim, work_end, work_held

log = logging.getLogger(__name__)
MAX_SAMPLE_ROWS = 64


def job_run_dir(job: TrainingJob) -> Path:
    return Path(settings.TRAINING_DIR) / f"job-{job.pk}"


def training_job_claim(job_id: int, worker: str) -> TrainingJob | None:
    """Take the job for this worker, or None when there is nothing to do: it is gone,
    over, or another live worker holds it (a duplicate delivery)."""
    with transaction.atomic():
        job = work_claim(TrainingJob, pk=job_id, worker=worker, resume_after=settings.TRAINING_STALE_AFTER_SECONDS)
        if job is not None:
            verb = "resuming" if job.attempts > 1 else "started"
            _event(job, JobEventKind.LOG, job.step, {"message": f"{verb} on {worker} (attempt {job.attempts})"})
    return job


def training_job_held_run(job: TrainingJob, worker: str, *, leave: tuple[type[BaseException], ...] = ()) -> str:
    """Train a job `worker` holds, beating its heart, and end it: finished, cancelled,
    stopped, or failed with the error. An error of a type in `leave` propagates and leaves
    the job running, for the caller to end (a data-parallel job's supervisor, which knows
    which process broke the group)."""
    stop_beat = threading.Event()
    beat = threading.Thread(target=job_heartbeat, args=(job.pk, worker, stop_beat), daemon=True)
    beat.start()
    from training.trainer.common import WorkLost

    try:
        result = job_train(job, worker)
    except WorkLost as lost:
        log.info("training job %s: %s", job.pk, lost)
        return "skipped"
    except leave:
        raise
    except Exception as exc:
        log.exception("training job %s failed", job.pk)
        tail = "".join(traceback.format_exception(exc)[-3:])[-2000:]
        job_end_logged(
            job.pk,
            worker,
            status=WorkStatus.FAILED,
            error=f"{type(exc).__name__}: {exc}"[:2000],
            message=f"failed: {tail}",
        )
        return WorkStatus.FAILED
    finally:
        stop_beat.set()
        beat.join(timeout=5)
    return _finish(job.pk, worker, result)


def job_heartbeat(job_id: int, worker: str, stop: threading.Event) -> None:
    """Beat while the loop runs: a step can take minutes on a CPU."""
    try:
        while not stop.wait(settings.TRAINING_HEARTBEAT_SECONDS):
            work_beat(TrainingJob, pk=job_id, worker=worker)
    finally:
        connection.close()


def job_items(job: TrainingJob) -> tuple[list[TurnItem], list[TurnItem]]:
    """(train, held-out) items of the job's training set."""
    return training_set_items(job.training_set)


def training_set_items(training_set: TrainingSet) -> tuple[list[TurnItem], list[TurnItem]]:
    """(train, held-out) items of `training_set`, as a job trains on them."""
    train, heldout = [], []
    for row in TrainingItem.objects.filter(training_set=training_set).order_by("id").iterator():
        item = TurnItem(
            id=row.key,
            messages=row.messages,
            tools=row.tools or None,
            # Without a judge rubric the critique itself is what the judge scores against.
            rubric=row.rubric if row.rubric is not None else row.feedback,
            reference=row.reference or None,
            grader=row.grader,
            feedback=row.feedback,
            target=row.corrected_response or None,
            # As the model wrote it: a logged turn that is a tool call has no words.
            logged_response=message_served_text(row.logged_response) if isinstance(row.logged_response, dict) else None,
        )
        (heldout if row.split == TrainingSplit.HELDOUT else train).append(item)
    return train, heldout


def job_train(job: TrainingJob, worker: str, *, owner: bool = True):
    """Run the job's loop. `owner`: this process writes the job's row and events (a
    data-parallel job's other processes train their shards with empty hooks)."""
    from training.trainer.common import Hooks

    config = config_from_dict(job.config)
    if getattr(config, "vllm_url", ""):
        # Checked again here: a config written past the create service must not send the
        # inference server's key, and this worker's rollouts, anywhere else.
        config.vllm_url = rollout_url_resolve(base_model=job.base_version.base_model, requested=config.vllm_url)
    run_dir = job_run_dir(job)
    run_dir.mkdir(parents=True, exist_ok=True)
    hooks = _hooks(job.pk, worker, Hooks) if owner else Hooks()
    if owner:
        job_phase_set(job.pk, worker, "loading")
    if job.kind == JobKind.EPISODES:
        return _train_episodes(job, config, run_dir, hooks)
    train, heldout = job_items(job)
    if job.kind == JobKind.GRPO:
        from training.trainer.grpo import grpo_train

        return grpo_train(
            config=config,
            items=train,
            score=scorer_for(train, deployment=job.deployment, job_id=job.pk),
            run_dir=run_dir,
            eval_items=heldout,
            hooks=hooks,
            vllm_api_key=settings.INFERENCE_API_KEY,
        )
    eval_items = [it for it in heldout if it.grader]  # compliance is measured by a grader
    score = scorer_for(eval_items, deployment=job.deployment, job_id=job.pk) if eval_items else None
    if job.kind == JobKind.DISTILL:
        from training.trainer.distill import distill_train

        items = [it for it in train if it.feedback]
        return distill_train(
            config=config, items=items, run_dir=run_dir, eval_items=eval_items, eval_score=score, hooks=hooks
        )
    from training.trainer.distill import sft_train

    return sft_train(config=config, items=train, run_dir=run_dir, eval_items=eval_items, eval_score=score, hooks=hooks)


def episode_job_tasks(tasks: list) -> tuple[list, list]:
    """(train, evaluation) tasks of an episodes job: it trains on the "train" split and
    evaluates on "validation" (or "heldout"); "test" and "fresh" tasks stay untouched."""
    train = [t for t in tasks if t.split == TrainingSplit.TRAIN]
    evaluation = [t for t in tasks if t.split in (TrainingSplit.HELDOUT, "validation")]
    return train, evaluation


def _train_episodes(job: TrainingJob, config, run_dir: Path, hooks):
    """Full-episode GRPO on the "train" tasks of the job's environment; its "validation"
    (or "heldout") tasks are the job's evaluation. A "test" task is never touched: the test
    split is for measuring the candidate afterwards. Every episode is recorded as a trace of
    the job's deployment."""
    from training.trainer.episodes import episodes_train

    env = environment_get(config.environment, **config.environment_options)
    train, heldout = episode_job_tasks(env.tasks())
    if config.record_traces and job.deployment is not None:
        hooks.on_episodes = _episode_recorder(job, env.name, hooks)
    judge = episode_judge(job.deployment, config.judge_rubric, job.pk) if config.judge_weight > 0 else None
    return episodes_train(
        config=config,
        env=env,
        tasks=train,
        run_dir=run_dir,
        eval_tasks=heldout,
        judge=judge,
        hooks=hooks,
        vllm_api_key=settings.INFERENCE_API_KEY,
    )


def _episode_recorder(job: TrainingJob, environment: str, hooks):
    deployment, version = job.deployment, job.base_version.name

    def on_episodes(step: int, phase: str, episodes: list) -> None:
        hooks.check_held()  # a worker whose job another took over records no trace
        model_version = version if step == 0 else f"{version}+job{job.pk}@step{step}"
        results = episodes_record(
            deployment=deployment,
            environment=environment,
            episodes=episodes,
            model_version=model_version,
            job_id=job.pk,
            step=step,
            phase=phase,
        )
        failed = [r for r in results if r.status == "error"]
        if failed:
            job_event_add(
                job.pk, JobEventKind.LOG, step, {"message": f"{len(failed)} episodes not recorded: {failed[0].errors}"}
            )

    return on_episodes


def job_phase_set(job_id: int, worker: str, name: str, done: int = 0, total: int = 0) -> None:
    """Record what the job is doing now (and beat the heart). A phase that starts is also a
    line of the job's log, so the page is never silent while the job works."""
    now = timezone.now()
    row = TrainingJob.objects.filter(pk=job_id, worker=worker).values("phase", "step").first()
    if row is None:
        return
    previous = row["phase"] or {}
    starts = previous.get("name") != name or (name in ("sampling", "update") and previous.get("total") != total)
    since = now.isoformat() if starts or (name == "evaluation" and done == 0) else previous.get("since")
    phase = {"name": name, "done": done, "total": total, "since": since or now.isoformat()}
    work_beat(TrainingJob, pk=job_id, worker=worker, now=now, phase=phase)
    if previous.get("name") != name and name not in ("sampling", "update"):
        size = f" ({total} to go)" if total and name == "evaluation" else ""
        job_event_add(job_id, JobEventKind.LOG, row["step"], {"message": f"{PHASE_LABELS.get(name, name)}{size}"})


def _hooks(job_id: int, worker: str, Hooks):
    jobs = work_held(TrainingJob, pk=job_id, worker=worker)

    def held() -> None:
        # A worker whose job the sweep gave to another writes nothing more: no event, no
        # trace, no checkpoint (the other resumes from the same folder).
        hooks.check_held()

    def on_step(step: int, metrics: dict) -> None:
        clean = {k: v for k, v in metrics.items() if v is not None}
        held()
        _event_create(job_id=job_id, kind=JobEventKind.STEP, step=step, data=clean)
        work_beat(TrainingJob, pk=job_id, worker=worker, step=step, metrics=clean)

    def on_eval(step: int, metrics: dict) -> None:
        held()
        # How long the evaluation took, from its phase's start: the ETA counts evaluations.
        phase = TrainingJob.objects.filter(pk=job_id).values_list("phase", flat=True).first() or {}
        if phase.get("name") == "evaluation" and phase.get("since"):
            started = datetime.fromisoformat(phase["since"])
            metrics = {**metrics, "eval_seconds": round((timezone.now() - started).total_seconds(), 3)}
        _event_create(job_id=job_id, kind=JobEventKind.EVAL, step=step, data=metrics)
        job = TrainingJob.objects.get(pk=job_id)
        summary = dict(job.eval_metrics or {})
        summary.setdefault("first", metrics)
        summary["latest"] = metrics
        jobs.update(eval_metrics=summary)

    def on_samples(step: int, rows: list[dict]) -> None:
        held()
        _event_create(job_id=job_id, kind=JobEventKind.SAMPLE, step=step, data={"rows": rows[:MAX_SAMPLE_ROWS]})

    def on_checkpoint(step: int, path: Path) -> None:
        jobs.update(checkpoint_path=str(path), checkpoint_step=step)
        job_event_add(job_id, JobEventKind.LOG, step, {"message": f"checkpoint at step {step}"})

    def on_breach(step: int, breaches: list[dict]) -> None:
        held()
        job = TrainingJob.objects.get(pk=job_id)
        jobs.update(flagged=True, breaches=[*job.breaches, *breaches][-100:])
        for breach in breaches:
            _event_create(job_id=job_id, kind=JobEventKind.BREACH, step=step, data=breach)

    def should_stop() -> bool:
        # A cancel stops with a checkpoint; a job another worker took over (or the sweep
        # ended) raises WorkLost instead, so nothing is written on the way out.
        if work_beat(TrainingJob, pk=job_id, worker=worker):
            return False
        held()
        return True

    def log_line(message: str) -> None:
        job_event_add(job_id, JobEventKind.LOG, 0, {"message": message})

    def on_phase(name: str, done: int, total: int) -> None:
        job_phase_set(job_id, worker, name, done, total)

    hooks = Hooks(
        on_phase=on_phase,
        on_step=on_step,
        on_eval=on_eval,
        on_samples=on_samples,
        on_checkpoint=on_checkpoint,
        on_breach=on_breach,
        should_stop=should_stop,
        log=log_line,
        holds=jobs.exists,
    )
    return hooks


def _finish(job_id: int, worker: str, result) -> str:
    """End the job as the loop's `result` says, if this worker still holds it ("skipped"
    otherwise: the sweep or another worker has it); a finished one registers its candidate."""
    status = {"cancelled": WorkStatus.CANCELLED, "stopped": WorkStatus.STOPPED}.get(result.status, WorkStatus.FINISHED)
    now = timezone.now()

    def settle(job: TrainingJob) -> list[str]:
        if status == WorkStatus.STOPPED:
            job.error = "stopped by a monitor: " + "; ".join(b["message"] for b in result.breaches[-3:])
        elif status == WorkStatus.FINISHED:
            job_phase_set(job.pk, worker, "registration", 0, 1)
            job.refresh_from_db(fields=["phase"])
            job.result_version = _register_candidate(job, result.export_path)
        job.heartbeat_at = now
        job.phase = {**(job.phase or {}), "name": "done", "done": 1, "total": 1, "since": now.isoformat()}
        return ["error", "result_version", "heartbeat_at", "phase"]

    ended: list[TrainingJob] = []

    def logged(job: TrainingJob) -> None:
        message = f"{job.get_status_display().lower()} at step {result.step}"
        if job.result_version_id:
            message += f"; candidate version {job.result_version.name}"
        _event(job, JobEventKind.LOG, result.step, {"message": message})
        ended.append(job)

    work_end(TrainingJob, pk=job_id, worker=worker, status=status, now=now, settle=settle, on_end=logged)
    return ended[0].status if ended else "skipped"


def _register_candidate(job: TrainingJob, export_path: Path | None) -> ModelVersion:
    """A new version (status candidate), child of the version trained from. The live
    pointer is not touched: promotion is a separate, approved step."""
    if export_path is None:
        raise RuntimeError("the job finished without an exported model")

    parent = job.base_version
    # The parent's name is cut so the job's own suffix always survives: a long chain of
    # jobs can never produce its parent's (or any registered) name again.
    name = model_version_name_free(slugify(f"{parent.name[:80]}-{job.kind}-job{job.pk}"))
    # The folder is new and unique (never derived from the name): nothing of a registered
    # version is ever deleted or written into.
    dest = model_folder_claim(prefix=f"job{job.pk}")
    _move_into(export_path, dest)

    lora = job.config.get("adapter") == "lora"
    return model_version_create(
        name=name,
        base_model=parent.base_model,
        kind=ModelVersionKind.LORA if lora else ModelVersionKind.FULL,
        path=dest,
        parent=parent,
        deployment=job.deployment,
        created_by=job.created_by,
        metadata={
            "training_job": job.pk,
            "job_kind": job.kind,
            "training_set": job.training_set_id,
            "steps": job.step,
            "eval": job.eval_metrics,
            "flagged": job.flagged,
        },
    )


def _move_into(source: Path, dest: Path) -> None:
    """Move the folder `source` to `dest`, an empty folder just claimed for it."""
    try:
        # On one filesystem, rename(2) replaces an empty directory atomically.
        os.rename(source, dest)
    except OSError:
        # Another filesystem (the run folder and the models folder may be on different
        # mounts): copy into the claimed folder, then drop the run's copy.
        shutil.copytree(source, dest, dirs_exist_ok=True)
        shutil.rmtree(source, ignore_errors=True)


def job_end_logged(job_id: int, worker: str, *, status: str, message: str, error: str | None = None) -> None:
    """End a job this worker holds as `status` (with `error`, when given) and log `message`
    at its step; a no-op when the job has ended already (rank 0 ended it, or the sweep)."""
    work_end(
        TrainingJob,
        pk=job_id,
        worker=worker,
        status=status,
        error=error,
        on_end=lambda row: job_event_add(row.pk, JobEventKind.LOG, row.step, {"message": message}),
    )


def _event(job: TrainingJob, kind: str, step: int, data: dict) -> None:
    _event_create(job=job, kind=kind, step=step, data=data)


def _event_create(**fields) -> TrainingJobEvent:
    """A job's event, its data free of NUL: samples and metrics hold the model's own text,
    which may contain U+0000, and PostgreSQL's jsonb cannot (the job failed on it)."""
    return TrainingJobEvent.objects.create(**(fields | {"data": strip_nul(fields.get("data"))}))


def job_event_add(job_id: int, kind: str, step: int, data: dict) -> None:
    _event_create(job_id=job_id, kind=kind, step=step, data=data)
