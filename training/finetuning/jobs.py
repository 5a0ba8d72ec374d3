"""OpenAI's fine-tuning API mapped onto Practicum: a `fine-tune` file becomes a training set
when a job is made from it, a `supervised` job is an SFT job on the file's assistant turns,
a `reinforcement` job is a GRPO job scored by the request's grader (`score_model` by the
deployment's judge, under the judge's training gate), and the job's result is a candidate
version, which serves only after an evaluation and another person's approval.

What a request costs is bounded: an upload is stored and its lines are read by a worker
(`file_validate`, the file's status `uploaded` → `processed` or `error`); a job is checked and
stored at once, and a worker builds its training set (`fine_tuning_job_prepare`, the job
`validating_files` meanwhile) within the bounds of `training.finetuning.lines`. Every stored
byte of a deployment's files, deleted ones included until their content is dropped, and of
the training items made from them counts against `FINETUNE_STORAGE_MAX_BYTES`.

Every call acts for one deployment API key with the `train` scope and sees only the files
and jobs of that key's deployment."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from feedback.models import ApiKey
from training.finetuning.files import (
    FineTuningNotFound,
    _content_drop_if_unneeded,
    _deployment_lock,
    _name,
    _quota_check,
    file_get,
    file_validate,
)
from training.finetuning.lines import FineTuningError, reinforcement_items, supervised_items
from training.finetuning.models import FileStatus, FineTuningFile, FineTuningJob
from training.finetuning.tasks import fine_tuning_job_prepare_task
from training.models import JobEventKind, JobKind, TrainingJob, TrainingJobEvent
from training.services.jobs import (
    JobError,
    training_job_awaits_set,
    training_job_cancel,
    training_job_hold,
    training_job_refuse,
    training_job_set_attach,
)
from training.services.judge_gate import JudgeGateClosed, judge_gate_pass
from training.services.training_sets import TrainingSetError, training_set_create
from training.serving.models import Deployment, ModelVersion
from training.trainer import openai_graders
from training.trainer.config import GRPOConfig, SFTConfig
from webapp.kernel.errors import Conflict
from webapp.kernel.ids import parse_id
from webapp.kernel.nul import strip_nul
from webapp.kernel.work import WorkStatus

MAX_GRADER_BYTES = 8_192
MAX_EPOCHS = 50
MAX_BATCH = 256
CANDIDATE_NOTE = (
    "Practicum trains a candidate version of {model}. It does not serve until an evaluation "
    "has been run on it and another person has approved its promotion (the promotion page or "
    "/api/v1/promotions)."
)


@dataclass(frozen=True)
class Plan:
    kind: str
    grader: dict[str, Any] | None
    hyperparameters: dict[str, Any]


def _method(method: Any, hyperparameters: Any) -> Plan:
    """The request's `method` (or the older top-level `hyperparameters`, which means
    supervised) as a job kind, a grader and the hyperparameters asked for."""
    if method is None:
        method = {"type": "supervised", "supervised": {"hyperparameters": hyperparameters or {}}}
    elif hyperparameters:
        raise FineTuningError([("hyperparameters", "give them inside method, not beside it")])
    if not isinstance(method, dict):
        raise FineTuningError([("method", "must be an object")])
    kind = method.get("type")
    if kind not in ("supervised", "reinforcement"):
        raise FineTuningError([("method.type", "must be supervised or reinforcement (dpo is not served here)")])
    body = method.get(kind) or {}
    if not isinstance(body, dict):
        raise FineTuningError([(f"method.{kind}", "must be an object")])
    asked = body.get("hyperparameters") or {}
    if not isinstance(asked, dict):
        raise FineTuningError([(f"method.{kind}.hyperparameters", "must be an object")])
    grader = None
    if kind == "reinforcement":
        grader = body.get("grader")
        try:
            openai_graders.spec_validate(grader, field="method.reinforcement.grader")
        except openai_graders.GraderSpecError as exc:
            raise FineTuningError(exc.errors) from None
        # Each line's item carries the grader: its size bounds what a job stores.
        if len(json.dumps(grader)) > MAX_GRADER_BYTES:
            raise FineTuningError([("method.reinforcement.grader", f"at most {MAX_GRADER_BYTES} bytes as JSON")])
        grader = strip_nul(grader)
    return Plan(kind=kind, grader=grader, hyperparameters=asked)


def _choice(asked: dict[str, Any], name: str, field: str, *, default, low, high, integer=True):
    value = asked.get(name, "auto")
    if value == "auto" or value is None:
        return default
    wrong = isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
    if wrong or not math.isfinite(value) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise FineTuningError([(f"{field}.{name}", f"must be 'auto' or {kind} from {low} to {high}")])
    return value


def _config(plan: Plan, *, train_count: int, has_validation: bool, seed: int) -> dict[str, Any]:
    field = f"method.{plan.kind}.hyperparameters"
    known = {"n_epochs", "batch_size", "learning_rate_multiplier"}
    if plan.kind == "reinforcement":
        known |= {"eval_interval", "eval_samples", "compute_multiplier", "reasoning_effort"}
    unknown = sorted(set(plan.hyperparameters) - known)
    if unknown:
        raise FineTuningError([(f"{field}.{unknown[0]}", f"is not one of {', '.join(sorted(known))}")])
    asked = plan.hyperparameters
    for name in ("compute_multiplier", "reasoning_effort"):
        if asked.get(name, "auto") not in ("auto", None, "default"):
            raise FineTuningError([(f"{field}.{name}", "only 'auto' is served here")])
    epochs = _choice(asked, "n_epochs", field, default=3 if plan.kind == "supervised" else 1, low=1, high=MAX_EPOCHS)
    batch = _choice(asked, "batch_size", field, default=min(4, train_count), low=1, high=MAX_BATCH)
    multiplier = _choice(asked, "learning_rate_multiplier", field, default=1.0, low=1e-3, high=100, integer=False)
    steps = max(1, math.ceil(train_count * epochs / batch))
    base_lr = _base_learning_rate(plan.kind)
    config: dict[str, Any] = {
        "steps": steps,
        "prompts_per_step": batch,
        "learning_rate": base_lr * multiplier,
        "seed": seed,
        "checkpoint_every": 0,
    }
    if plan.kind == "reinforcement":
        interval = _choice(asked, "eval_interval", field, default=0, low=1, high=10_000)
        # With a validation file the held-out lines are graded at the end at least.
        config["eval_every"] = (interval or steps) if has_validation else 0
        config["eval_samples"] = _choice(asked, "eval_samples", field, default=2, low=1, high=64)
    else:
        config["eval_every"] = 0
    config["n_epochs"] = epochs  # what was asked for, reported back (not a job setting)
    return config


def _base_learning_rate(kind: str) -> float:
    """The job kind's own default rate, which `learning_rate_multiplier` multiplies."""
    return SFTConfig.learning_rate if kind == "supervised" else GRPOConfig.learning_rate


def _version(api_key: ApiKey, name: Any) -> ModelVersion:
    if not isinstance(name, str) or not name:
        raise FineTuningError([("model", "name a model version (GET /api/v1/models lists them)")])
    _name(name, "model")
    versions = ModelVersion.objects.select_related("base_model").filter(name=name)
    version = versions.filter(deployment=api_key.deployment).first() or versions.filter(deployment__isnull=True).first()
    if version is None:
        raise FineTuningError([("model", f"no model version {name!r} for this deployment")])
    return version


def _text(value: Any, field: str, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        raise FineTuningError([(field, f"must be a string of at most {limit} characters")])
    return value


def _metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    good = isinstance(value, dict) and len(value) <= 16
    good = good and all(
        isinstance(k, str) and len(k) <= 64 and isinstance(v, str) and len(v) <= 512 and "\x00" not in k + v
        for k, v in value.items()
    )
    if not good:
        raise FineTuningError([("metadata", "at most 16 string keys (64 characters) and values (512)")])
    return value


@transaction.atomic
def fine_tuning_job_create(
    *,
    api_key: ApiKey,
    model: Any,
    training_file: Any,
    validation_file: Any = None,
    method: Any = None,
    hyperparameters: Any = None,
    suffix: Any = None,
    seed: Any = None,
    metadata: Any = None,
    enqueue: bool = True,
) -> FineTuningJob:
    """Check the request and store the job (`validating_files`); a worker then builds its
    training set from the files and queues the training (`fine_tuning_job_prepare`). What
    can be told from the request and what reading the files found already is refused here,
    before anything is written, naming the request's field."""
    version = _version(api_key, model)
    plan = _method(method, hyperparameters)
    suffix_text = _text(suffix, "suffix", 64)
    tags = _metadata(metadata)
    if seed is None:
        seed = 0
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 2**31 - 1:
        raise FineTuningError([("seed", "must be an integer from 0 to 2147483647")])
    if not isinstance(training_file, str):
        raise FineTuningError([("training_file", "name an uploaded file")])
    _deployment_lock(api_key.deployment_id)
    train_file = file_get(api_key=api_key, file_id=training_file, field="training_file", lock=True)
    check_file = None
    if validation_file is not None:
        if not isinstance(validation_file, str):
            raise FineTuningError([("validation_file", "name an uploaded file")])
        check_file = file_get(api_key=api_key, file_id=validation_file, field="validation_file", lock=True)
    files = [(train_file, "training_file"), *([(check_file, "validation_file")] if check_file else [])]
    _files_read_check(files, plan, api_key.deployment)
    if plan.grader and plan.grader["type"] == "score_model":
        _judge_gate_open(api_key)
    # The settings are checked now; the batch size that depends on the number of items is
    # settled once the files are read.
    config = _config(plan, train_count=1, has_validation=bool(check_file), seed=seed)
    epochs = config.pop("n_epochs")
    kind = JobKind.SFT if plan.kind == "supervised" else JobKind.GRPO
    try:
        job = training_job_hold(
            kind=kind,
            config=config,
            base_version=version,
            deployment=api_key.deployment,
            message="reading the fine-tuning files into a training set",
        )
    except JobError as exc:
        raise FineTuningError([(_request_field(f), r) for f, r in exc.errors]) from None
    TrainingJobEvent.objects.create(
        job=job, kind=JobEventKind.LOG, step=0, data={"message": CANDIDATE_NOTE.format(model=version.name)}
    )
    asked_batch = plan.hyperparameters.get("batch_size", "auto")
    ft = FineTuningJob.objects.create(
        job=job,
        api_key=api_key,
        training_file=train_file,
        validation_file=check_file,
        model=version.name,
        # The hyperparameters as asked, for the worker that settles them.
        method={"type": plan.kind, **({"grader": plan.grader} if plan.grader else {}), "asked": plan.hyperparameters},
        hyperparameters={
            "n_epochs": epochs,
            "batch_size": "auto" if asked_batch in ("auto", None) else config["prompts_per_step"],
            "learning_rate_multiplier": config["learning_rate"] / _base_learning_rate(plan.kind),
        },
        suffix=suffix_text,
        seed=seed,
        metadata=tags,
    )
    if enqueue:
        fine_tuning_job_prepare_task.delay_on_commit(job.pk)
    return ft


def _files_read_check(files: list[tuple[FineTuningFile, str]], plan: Plan, deployment: Deployment) -> None:
    """Refuse a job over what reading its files found already: a file in `error`, or (for
    a supervised job) a line that makes no item, items past the per-job bound or the quota."""
    for upload, field in files:
        if upload.status == FileStatus.ERROR:
            raise FineTuningError([(field, f"{upload.id} cannot be used: {upload.status_details}")])
    if plan.kind != "supervised" or any(u.status != FileStatus.PROCESSED for u, _ in files):
        return  # the worker checks the rest as it reads
    for upload, field in files:
        if upload.summary.get("supervised_problem"):
            raise FineTuningError([(field, upload.summary["supervised_problem"])])
    size = sum(int(u.summary.get("supervised_item_bytes", 0)) for u, _ in files)
    bound = settings.FINETUNE_MAX_ITEM_BYTES
    if size > bound:
        raise FineTuningError(
            [
                (
                    files[0][1],
                    f"makes {size} bytes of training items; at most {bound} per job (PRACTICUM_FINETUNE_MAX_ITEM_BYTES)",
                )
            ]
        )
    _quota_check(deployment, size, files[0][1])


def fine_tuning_job_prepare(*, job_id: int, enqueue: bool = True) -> FineTuningJob | None:
    """On a worker (the default queue): read a job's files into its training set, within the
    bounds, and queue the training; or fail the job with OpenAI's error object saying which
    file and why. A job that no longer waits (cancelled, or prepared by an earlier delivery)
    is left as it is."""
    related = ("job", "api_key__deployment", "training_file", "validation_file")
    ft = FineTuningJob.objects.select_related(*related).filter(pk=job_id).first()
    if ft is None or not training_job_awaits_set(ft.job):
        return ft
    for upload in (ft.training_file, ft.validation_file):
        if upload is not None and upload.status == FileStatus.UPLOADED:
            file_validate(file_id=upload.id)
    try:
        with transaction.atomic():
            _deployment_lock(ft.api_key.deployment_id)
            ft = FineTuningJob.objects.select_related(*related).get(pk=job_id)
            # Held until the set is attached: a cancel meanwhile waits, then finds it queued.
            ft.job = TrainingJob.objects.select_for_update().get(pk=job_id)
            if not training_job_awaits_set(ft.job):
                return ft
            _prepare(ft, enqueue=enqueue)
    except (FineTuningError, JobError, TrainingSetError) as exc:
        field, reason = exc.errors[0]
        param = field if field in ("training_file", "validation_file") else _request_field(field)
        code = {"training_file": "invalid_training_file", "validation_file": "invalid_validation_file"}
        with transaction.atomic():
            if training_job_refuse(job_id=job_id, reason=f"{param}: {reason}") is not None:
                ft.failure = {"code": code.get(param, "invalid_request"), "message": reason, "param": param}
                ft.save(update_fields=["failure"])
    with transaction.atomic():
        for upload in (ft.training_file, ft.validation_file):
            locked = FineTuningFile.objects.select_for_update().filter(pk=upload.pk).first() if upload else None
            if locked is not None:
                _content_drop_if_unneeded(locked)
    return ft


def _prepare(ft: FineTuningJob, *, enqueue: bool) -> None:
    files = [
        (ft.training_file, "training_file"),
        *([(ft.validation_file, "validation_file")] if ft.validation_file else []),
    ]
    for upload, field in files:
        if upload.status == FileStatus.ERROR:
            raise FineTuningError([(field, f"{upload.id} cannot be used: {upload.status_details}")])
    plan = Plan(kind=ft.method["type"], grader=ft.method.get("grader"), hyperparameters=_asked(ft))
    budget = settings.FINETUNE_MAX_ITEM_BYTES
    made: dict[str, list[dict]] = {}
    used = 0
    for upload, field in files:
        split = "train" if field == "training_file" else "heldout"
        if plan.kind == "supervised":
            items, size = supervised_items(
                content=upload.content, file_id=upload.id, split=split, field=field, budget=budget - used
            )
        else:
            items, size = reinforcement_items(
                content=upload.content,
                file_id=upload.id,
                grader=plan.grader,
                split=split,
                field=field,
                budget=budget - used,
            )
        made[field], used = items, used + size
    _quota_check(ft.api_key.deployment, used, "training_file")
    train, held = made["training_file"], made.get("validation_file", [])
    config = _config(plan, train_count=len(train), has_validation=bool(held), seed=ft.seed)
    epochs = config.pop("n_epochs")
    training_set = training_set_create(
        name=f"fine-tuning-{ft.training_file_id}",
        items=train + held,
        deployment=ft.api_key.deployment,
        heldout_fraction=0.0,
        selection={
            "kind": "fine-tuning file",
            "training_file": ft.training_file_id,
            "validation_file": ft.validation_file_id,
        },
        description=f"From {ft.training_file.filename} ({plan.kind} fine-tuning request)",
    )
    training_job_set_attach(job_id=ft.job_id, training_set=training_set, config=config, enqueue=enqueue)
    ft.items_bytes = used
    ft.hyperparameters = {
        "n_epochs": epochs,
        "batch_size": config["prompts_per_step"],
        "learning_rate_multiplier": config["learning_rate"] / _base_learning_rate(plan.kind),
    }
    ft.save(update_fields=["items_bytes", "hyperparameters"])


def _asked(ft: FineTuningJob) -> dict[str, Any]:
    """The hyperparameters as the request gave them."""
    return dict(ft.method.get("asked") or {})


def _judge_gate_open(api_key: ApiKey) -> None:
    """A score_model grader is the deployment's judge: its training gate must be open."""
    try:
        judge_gate_pass(deployments=[api_key.deployment], uses="a GRPO job rewarded by the judge")
    except JudgeGateClosed as exc:
        raise FineTuningError([("method", exc.reason)]) from None


def _request_field(field: str) -> str:
    """A job or set error's field in the request's words (the judge gate and the items are
    the training file's doing)."""
    if field in ("training_set", "items") or field.startswith("items["):
        return "training_file"
    if field == "config.adapter":  # a LoRA version trains on as LoRA
        return "model"
    # The settings, and the judge's training gate that a score_model grader needs open.
    return "method"


def _jobs(api_key: ApiKey):
    return FineTuningJob.objects.select_related("job", "job__result_version").filter(
        api_key__deployment=api_key.deployment
    )


def fine_tuning_job_get(*, api_key: ApiKey, job_id: str, field: str = "fine_tuning_job_id") -> FineTuningJob:
    number = job_id.removeprefix("ftjob-") if isinstance(job_id, str) else ""
    pk = parse_id(number)
    found = _jobs(api_key).filter(pk=pk).first() if pk is not None else None
    if found is None and field != "fine_tuning_job_id":
        raise FineTuningError([(field, f"no fine-tuning job {job_id!r}")])
    if found is None:
        raise FineTuningNotFound(f"no fine-tuning job {job_id!r}", field=field)
    return found


def fine_tuning_jobs_list(
    *, api_key: ApiKey, after: str | None = None, limit: int = 20, metadata: dict[str, str] | None = None
):
    jobs = _jobs(api_key).order_by("-job_id")
    metadata = _metadata(metadata or None)
    if after:
        jobs = jobs.filter(job_id__lt=fine_tuning_job_get(api_key=api_key, job_id=after, field="after").job_id)
    if not metadata:
        return list(jobs[: limit + 1])
    # Compared in Python: a key is then always a key (never a lookup path like `a__regex`, nor
    # an array index like "0"), on PostgreSQL and SQLite alike. A deployment's jobs are few.
    wanted = metadata.items()
    return [ft for ft in jobs.iterator(chunk_size=200) if wanted <= (ft.metadata or {}).items()][: limit + 1]


def fine_tuning_job_cancel(*, api_key: ApiKey, job_id: str) -> FineTuningJob:
    found = fine_tuning_job_get(api_key=api_key, job_id=job_id)
    if found.job.status == WorkStatus.CANCELLING:
        return found  # asked already: it stops at its next step
    if not found.job.is_active:
        raise Conflict(f"the job has already ended ({found.job.status})", field="fine_tuning_job_id")
    found.job = training_job_cancel(job=found.job, user=None)
    return found
