"""OpenAI's fine-tuning API mapped onto Practicum: a `fine-tune` file becomes a training set
when a job is made from it, a `supervised` job is an SFT job on the file's assistant turns,
a `reinforcement` job is a GRPO job scored by the request's grader (`score_model` by the
deployment's judge, under the judge's training gate), and the job's result is a candidate
version, which serves only after an evaluation and another person's approval.

Every call acts for one deployment API key with the `train` scope and sees only the files
and jobs of that key's deployment."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from feedback.models import ApiKey
from feedback.services.chat_format import MAX_JSON_DEPTH, json_depth
from feedback.services.ingest import strip_nul
from training.finetuning.models import FineTuningFile, FineTuningJob
from training.inference.codec import message_served_text
from training.models import JobEventKind, JobKind, TrainingItemKind, TrainingJob, TrainingJobEvent
from training.services.jobs import JobError, training_job_cancel, training_job_create
from training.services.training_sets import TrainingSetError, training_set_create
from training.serving.models import Deployment, ModelVersion
from training.trainer import openai_graders
from training.trainer.config import GRPOConfig, SFTConfig
from webapp.errors import Invalid, NotFound
from webapp.ids import parse_id
from webapp.work import WorkStatus

PURPOSE = "fine-tune"
MAX_LINE_ERRORS = 5
# A job is made from its files inside the request: these bound what one request can cost.
MAX_LINES = 10_000
MAX_GRADER_BYTES = 8_192
MAX_RUBRIC = 16_384
MAX_EPOCHS = 50
MAX_BATCH = 256
ROLES = ("system", "developer", "user", "assistant", "tool")
CANDIDATE_NOTE = (
    "Practicum trains a candidate version of {model}. It does not serve until an evaluation "
    "has been run on it and another person has approved its promotion (the promotion page or "
    "/api/v1/promotions)."
)


class FineTuningError(Invalid, ValueError):
    def __init__(self, errors: list[tuple[str, str]]):
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors), errors=errors)


class FineTuningNotFound(NotFound):
    pass


def _name(value: Any, field: str, limit: int = 120) -> str:
    """An id or name from a request, refused before it reaches a query (the database
    cannot hold a NUL, and nothing here is longer than `limit`)."""
    if not isinstance(value, str) or not value or len(value) > limit or "\x00" in value:
        raise FineTuningError([(field, f"must be an id or name of at most {limit} characters")])
    return value


def _visible_files(api_key: ApiKey):
    return FineTuningFile.objects.filter(api_key__deployment=api_key.deployment, deleted_at__isnull=True)


def file_create(*, api_key: ApiKey, filename: str, purpose: str, data: bytes) -> FineTuningFile:
    """Store an upload; its lines are read when a job is made from it."""
    if purpose != PURPOSE:
        raise FineTuningError([("purpose", f"must be {PURPOSE!r}: this server keeps fine-tuning files only")])
    limit = settings.FINETUNE_FILE_MAX_BYTES
    if len(data) > limit:
        raise FineTuningError([("file", f"is {len(data)} bytes; at most {limit}")])
    try:
        text = data.decode("utf-8-sig")  # a leading byte-order mark is not part of line 1
    except UnicodeDecodeError:
        raise FineTuningError([("file", "must be UTF-8 JSONL")]) from None
    if "\x00" in text:
        raise FineTuningError([("file", "must be UTF-8 JSONL (it holds a NUL character)")])
    with transaction.atomic():
        # The deployment's row lock makes two concurrent uploads count each other.
        Deployment.objects.select_for_update().filter(pk=api_key.deployment_id).first()
        stored = _visible_files(api_key).aggregate(total=Sum("bytes"))["total"] or 0
        quota = settings.FINETUNE_STORAGE_MAX_BYTES
        if stored + len(data) > quota:
            raise FineTuningError(
                [
                    (
                        "file",
                        f"would bring this deployment's stored files to {stored + len(data)} bytes; at most {quota}"
                        " (delete files no job needs)",
                    )
                ]
            )
        return FineTuningFile.objects.create(
            api_key=api_key,
            filename=strip_nul(filename or "upload.jsonl")[:255],
            purpose=purpose,
            content=text,
            bytes=len(data),
        )


def files_list(
    *, api_key: ApiKey, purpose: str | None = None, after: str | None = None, limit: int = 100, order: str = "desc"
):
    """The key's files, newest first (`order="desc"`, OpenAI's default) or oldest first;
    `after` is the last file of the previous page in the same order."""
    if order not in ("asc", "desc"):
        raise FineTuningError([("order", "must be 'asc' or 'desc'")])
    newest_first = order == "desc"
    files = _visible_files(api_key).order_by(*(("-created_at", "-id") if newest_first else ("created_at", "id")))
    if purpose:
        files = files.filter(purpose=_name(purpose, "purpose"))
    if after:
        anchor = file_get(api_key=api_key, file_id=after, field="after")
        if newest_first:
            files = files.filter(
                Q(created_at__lt=anchor.created_at) | Q(created_at=anchor.created_at, id__lt=anchor.id)
            )
        else:
            files = files.filter(
                Q(created_at__gt=anchor.created_at) | Q(created_at=anchor.created_at, id__gt=anchor.id)
            )
    return list(files[: limit + 1])


def file_get(*, api_key: ApiKey, file_id: str, field: str = "file_id", lock: bool = False) -> FineTuningFile:
    """The key's deployment's file; `lock` holds its row until the transaction ends, so a
    job being made from it and its deletion never interleave."""
    files = _visible_files(api_key)
    if lock:
        files = files.select_for_update()
    found = files.filter(pk=_name(file_id, field)).first()
    if found is None and field != "file_id":  # named in a body or a query: a bad request
        raise FineTuningError([(field, f"no file {file_id!r}")])
    if found is None:
        raise FineTuningNotFound(f"no file {file_id!r}", field=field)
    return found


@transaction.atomic
def file_delete(*, api_key: ApiKey, file_id: str) -> FineTuningFile:
    """Delete a file. One a job was made from is hidden instead, so the job keeps its
    provenance; its training set already holds the items."""
    found = file_get(api_key=api_key, file_id=file_id, lock=True)
    used = FineTuningJob.objects.filter(Q(training_file=found) | Q(validation_file=found)).exists()
    if used:
        found.deleted_at = timezone.now()
        found.save(update_fields=["deleted_at"])
    else:
        found.delete()
    return found


# --- reading a file's lines ------------------------------------------------------------------


def _lines(upload: FineTuningFile, field: str) -> list[tuple[int, dict[str, Any]]]:
    rows, errors = [], []
    # Lines end at "\n" only: JSON strings may hold U+2028, U+2029 or U+0085 raw, which
    # str.splitlines would also break on.
    for number, line in enumerate(upload.content.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        if len(rows) >= MAX_LINES:
            raise FineTuningError([(field, f"has more than {MAX_LINES} lines")])
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            errors.append((field, f"line {number} is not JSON"))
        else:
            if isinstance(row, dict) and json_depth(row) > MAX_JSON_DEPTH:
                errors.append((field, f"line {number} is nested deeper than {MAX_JSON_DEPTH} levels"))
            elif isinstance(row, dict):
                rows.append((number, strip_nul(row)))  # a "\u0000" escape: the store holds no NUL
            else:
                errors.append((field, f"line {number} must be a JSON object"))
        if len(errors) >= MAX_LINE_ERRORS:
            break
    if errors:
        raise FineTuningError(errors)
    if not rows:
        raise FineTuningError([(field, "has no lines")])
    return rows


def _messages(row: dict[str, Any], number: int, field: str) -> list[dict[str, Any]]:
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise FineTuningError([(field, f"line {number}: messages must be a non-empty list")])
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise FineTuningError([(field, f"line {number}: messages[{i}] needs a role of {', '.join(ROLES)}")])
        wrong = _message_shape(message)
        if wrong:
            raise FineTuningError([(field, f"line {number}: messages[{i}].{wrong}")])
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise FineTuningError([(field, f"line {number}: tools must be a list of tool definitions")])
    return messages


def _message_shape(message: dict[str, Any]) -> str:
    """What is wrong with a message's content or tool calls ("" when nothing): the chat
    format's shapes, which the SFT target and the exports read."""
    content = message.get("content")
    parts_ok = isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content
    )
    if content is not None and not isinstance(content, str) and not parts_ok:
        return "content must be text, a list of text parts, or null"
    calls = message.get("tool_calls")
    if calls is None:
        return ""
    if not isinstance(calls, list):
        return "tool_calls must be a list"
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return "tool_calls must each have a function with a name"
        if not isinstance(function.get("arguments", "{}"), str | dict):
            return "tool_calls' arguments must be a JSON string or an object"
    return ""


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def supervised_items(upload: FineTuningFile, *, split: str, field: str) -> list[dict[str, Any]]:
    """One SFT item per assistant message of each line (`weight: 0` leaves one out): the
    context before it, and the message, tool calls included, as the target."""
    items = []
    for number, row in _lines(upload, field):
        messages = _messages(row, number, field)
        targets = [i for i, m in enumerate(messages) if m["role"] == "assistant" and m.get("weight", 1) != 0]
        if not targets:
            raise FineTuningError([(field, f"line {number}: no assistant message to train on")])
        for i in targets:
            target = message_served_text(messages[i])
            if not target.strip():
                raise FineTuningError([(field, f"line {number}: messages[{i}] has no content or tool calls")])
            context = [{k: v for k, v in m.items() if k != "weight"} for m in messages[:i]]
            if not context:
                raise FineTuningError([(field, f"line {number}: messages[{i}] has no context before it")])
            items.append(
                {
                    "kind": TrainingItemKind.TURN,
                    "key": f"ft:{upload.id}:{number}:{i}:{_key(context, target)}",
                    "messages": context,
                    "tools": row.get("tools") or [],
                    "corrected_response": target,
                    "split": split,
                    "provenance": {"source": "fine-tuning file", "file": upload.id, "line": number},
                }
            )
    return items


def reinforcement_items(upload: FineTuningFile, grader: dict[str, Any], *, split: str, field: str) -> list[dict]:
    """One task per line: its messages are the prompt, and the rest of the line is what the
    grader's `{{ item.… }}` templates read. A `score_model` grader becomes the judge's rubric."""
    needed = openai_graders.item_fields(grader)
    items = []
    for number, row in _lines(upload, field):
        messages = _messages(row, number, field)
        if messages[-1]["role"] == "assistant":
            raise FineTuningError([(field, f"line {number}: a reinforcement prompt ends before the answer")])
        item = {k: v for k, v in row.items() if k not in ("messages", "tools")}
        missing = [f for f in needed if openai_graders._lookup(item, f.split(".")) is None]
        if missing:
            raise FineTuningError([(field, f"line {number}: the grader reads item.{missing[0]}, which it lacks")])
        common = {
            "key": f"ft:{upload.id}:{number}:{_key(messages, item)}",
            "messages": messages,
            "tools": row.get("tools") or [],
            "split": split,
            "provenance": {"source": "fine-tuning file", "file": upload.id, "line": number},
        }
        if grader["type"] == "score_model":
            rubric = _judge_rubric(grader, item, number, field)
            items.append({**common, "kind": TrainingItemKind.TURN, "rubric": rubric})
        else:
            reference = json.dumps({"grader": grader, "item": item}, ensure_ascii=False)
            items.append({**common, "kind": TrainingItemKind.TASK, "grader": "openai", "reference": reference})
    return items


def _judge_rubric(grader: dict[str, Any], item: dict[str, Any], number: int, field: str) -> str:
    """A `score_model` grader's prompt, with the line's fields filled in, as the rubric the
    judge scores each sampled response under."""
    parts = []
    for message in grader.get("input") or []:
        text = openai_graders.render(
            openai_graders._content(message), output_text="(the response being scored)", item=item
        )
        parts.append(f"{message.get('role', 'user')}: {text}")
    low, high = grader.get("range", [0, 1])
    parts.append(f"Score from {low} to {high}.")
    rubric = "\n".join(parts)
    if len(rubric) > MAX_RUBRIC:
        raise FineTuningError([(field, f"line {number}: the grader's prompt fills to over {MAX_RUBRIC} characters")])
    return rubric


# --- jobs --------------------------------------------------------------------------------------


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
    """Read the files, build the training set, and queue the job (checked before anything
    is written; a refusal names the request's field)."""
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
    train_file = file_get(api_key=api_key, file_id=training_file, field="training_file", lock=True)
    check_file = None
    if validation_file is not None:
        if not isinstance(validation_file, str):
            raise FineTuningError([("validation_file", "name an uploaded file")])
        check_file = file_get(api_key=api_key, file_id=validation_file, field="validation_file", lock=True)
    if plan.grader and plan.grader["type"] == "score_model":
        _judge_gate_open(api_key)  # before any line is read

    def items_of(upload: FineTuningFile, split: str, field: str) -> list[dict]:
        if plan.kind == "supervised":
            return supervised_items(upload, split=split, field=field)
        return reinforcement_items(upload, plan.grader, split=split, field=field)

    train = items_of(train_file, "train", "training_file")
    held = items_of(check_file, "heldout", "validation_file") if check_file else []
    config = _config(plan, train_count=len(train), has_validation=bool(held), seed=seed)
    epochs = config.pop("n_epochs")
    kind = JobKind.SFT if plan.kind == "supervised" else JobKind.GRPO
    try:
        training_set = training_set_create(
            name=f"fine-tuning-{train_file.id}",
            items=train + held,
            deployment=api_key.deployment,
            heldout_fraction=0.0,
            selection={"kind": "fine-tuning file", "training_file": train_file.id, "validation_file": validation_file},
            description=f"From {train_file.filename} ({plan.kind} fine-tuning request)",
        )
        job = training_job_create(
            kind=kind,
            config=config,
            base_version=version,
            training_set=training_set,
            deployment=api_key.deployment,
            enqueue=enqueue,
        )
    except (JobError, TrainingSetError) as exc:
        raise FineTuningError([(_request_field(f), r) for f, r in exc.errors]) from None
    TrainingJobEvent.objects.create(
        job=job, kind=JobEventKind.LOG, step=0, data={"message": CANDIDATE_NOTE.format(model=version.name)}
    )
    return FineTuningJob.objects.create(
        job=job,
        api_key=api_key,
        training_file=train_file,
        validation_file=check_file,
        model=version.name,
        method={"type": plan.kind, **({"grader": plan.grader} if plan.grader else {})},
        hyperparameters={
            "n_epochs": epochs,
            "batch_size": config["prompts_per_step"],
            "learning_rate_multiplier": config["learning_rate"] / _base_learning_rate(plan.kind),
        },
        suffix=suffix_text,
        seed=seed,
        metadata=tags,
    )


def _judge_gate_open(api_key: ApiKey) -> None:
    """A score_model grader is the deployment's judge: its training gate must be open."""
    from training.services.judge_gate import JudgeGateClosed, judge_gate_pass

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
        from webapp.errors import Conflict

        raise Conflict(f"the job has already ended ({found.job.status})", field="fine_tuning_job_id")
    found.job = training_job_cancel(job=found.job, user=None)
    return found


def job_events(*, ft: FineTuningJob, after: str | None = None, limit: int = 20) -> list[TrainingJobEvent]:
    """The job's events, newest first (OpenAI's order), without the sample rollouts."""
    events = TrainingJobEvent.objects.filter(job_id=ft.job_id).exclude(kind=JobEventKind.SAMPLE).order_by("-id")
    if after:
        before = parse_id(after.removeprefix("ftevent-"))
        if before is None:
            raise FineTuningError([("after", "must be an event id from this list")])
        events = events.filter(id__lt=before)
    return list(events[: limit + 1])


def event_message(event: TrainingJobEvent, total: int) -> tuple[str, str, str]:
    """(level, type, message) of an event, in the words OpenAI's events use."""
    data = event.data or {}
    if event.kind in (JobEventKind.STEP, JobEventKind.EVAL):
        shown = ", ".join(f"{k}={v:.4g}" for k, v in data.items() if isinstance(v, float | int) and k != "step")
        if event.kind == JobEventKind.STEP:
            return "info", "metrics", f"Step {event.step}/{total}: {shown}"
        return "info", "metrics", f"Evaluation at step {event.step}: {shown}"
    if event.kind == JobEventKind.BREACH:
        return "warn", "message", f"A monitor fired at step {event.step}: {data.get('message') or data}"
    message = str(data.get("message") or "")
    level = "error" if message.startswith(("failed", "error")) else "info"
    return level, "message", message


def job_status(job: TrainingJob) -> str:
    """Practicum's job status in OpenAI's words."""
    return {
        "queued": "queued",
        "running": "running",
        "cancelling": "running",
        "cancelled": "cancelled",
        "finished": "succeeded",
        "stopped": "failed",
        "failed": "failed",
    }.get(job.status, job.status)
