"""Fine-tuning files: an upload stored and read by a worker, listed, deleted, and the storage
a deployment's files and training items use against `FINETUNE_STORAGE_MAX_BYTES`."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, Sum
from django.utils import timezone

from feedback.models import ApiKey
from training.finetuning.lines import FineTuningError, file_check
from training.finetuning.models import FileStatus, FineTuningFile, FineTuningJob
from training.finetuning.tasks import file_validate_task
from training.services.jobs import training_job_awaits_set
from training.serving.models import Deployment
from webapp.kernel.errors import NotFound
from webapp.kernel.nul import strip_nul

PURPOSE = "fine-tune"


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


def storage_used(*, deployment: Deployment) -> int:
    """Bytes a deployment's fine-tuning data holds: every file's stored content, deleted
    (hidden) files' too until it is dropped, and the training items made from its files,
    which stay as long as their jobs."""
    files = FineTuningFile.objects.filter(api_key__deployment=deployment).aggregate(n=Sum("stored_bytes"))["n"]
    items = FineTuningJob.objects.filter(api_key__deployment=deployment).aggregate(n=Sum("items_bytes"))["n"]
    return (files or 0) + (items or 0)


def _quota_check(deployment: Deployment, adding: int, field: str) -> None:
    stored, quota = storage_used(deployment=deployment), settings.FINETUNE_STORAGE_MAX_BYTES
    if stored + adding > quota:
        raise FineTuningError(
            [
                (
                    field,
                    f"would bring this deployment's fine-tuning storage to {stored + adding} bytes; at most {quota}"
                    " (PRACTICUM_FINETUNE_STORAGE_MAX_BYTES: files, deleted ones a job still needs, and the"
                    " training items jobs made; delete files no job needs)",
                )
            ]
        )


def _deployment_lock(deployment_id: int) -> None:
    """Hold the deployment's row: uploads and jobs of one deployment count each other's bytes."""
    Deployment.objects.select_for_update().filter(pk=deployment_id).first()


def file_create(*, api_key: ApiKey, filename: str, purpose: str, data: bytes) -> FineTuningFile:
    """Store an upload (`uploaded`); a worker reads its lines (`file_validate`)."""
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
        _deployment_lock(api_key.deployment_id)
        _quota_check(api_key.deployment, len(data), "file")
        created = FineTuningFile.objects.create(
            api_key=api_key,
            filename=strip_nul(filename or "upload.jsonl")[:255],
            purpose=purpose,
            content=text,
            bytes=len(data),
            stored_bytes=len(data),
        )

        file_validate_task.delay_on_commit(created.id)
        return created


@transaction.atomic
def file_validate(*, file_id: str) -> FineTuningFile | None:
    """Read an uploaded file's lines: `processed`, or `error` with the first few reasons in
    `status_details` (a file read already is left as it is)."""
    upload = FineTuningFile.objects.select_for_update().filter(pk=file_id).first()
    if upload is None or upload.status != FileStatus.UPLOADED:
        return upload
    errors, summary = file_check(upload.content)
    upload.status = FileStatus.ERROR if errors else FileStatus.PROCESSED
    upload.status_details = "; ".join(errors)
    upload.summary = summary
    upload.save(update_fields=["status", "status_details", "summary"])
    return upload


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
    provenance (its training set holds the items); its content is dropped as soon as no job
    still has to read it, and until then it counts against the storage quota."""
    found = file_get(api_key=api_key, file_id=file_id, lock=True)
    if not _file_jobs(found).exists():
        found.delete()
        return found
    found.deleted_at = timezone.now()
    found.save(update_fields=["deleted_at"])
    _content_drop_if_unneeded(found)
    return found


def _file_jobs(upload: FineTuningFile):
    return FineTuningJob.objects.filter(Q(training_file=upload) | Q(validation_file=upload))


def _content_drop_if_unneeded(upload: FineTuningFile) -> None:
    """A deleted file's content goes once no job waits to read it: its bytes are then gone."""
    if upload.deleted_at is None or not upload.stored_bytes:
        return
    if any(training_job_awaits_set(ft.job) for ft in _file_jobs(upload).select_related("job")):
        return
    upload.content, upload.stored_bytes = "", 0
    upload.save(update_fields=["content", "stored_bytes"])
