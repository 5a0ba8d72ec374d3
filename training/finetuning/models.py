"""Uploaded files and the fine-tuning jobs made from them, each owned by a deployment."""

from __future__ import annotations

import secrets

from django.db import models
from django.utils import timezone


def file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


class FileStatus(models.TextChoices):
    """OpenAI's file statuses: its lines are read off the request path after the upload."""

    UPLOADED = "uploaded", "Uploaded, not read yet"
    PROCESSED = "processed", "Read: every line can train"
    ERROR = "error", "Refused (status_details says why)"


class FineTuningFile(models.Model):
    """A JSONL file uploaded with purpose `fine-tune`. The upload is checked for size and
    encoding; its lines are read by a worker (status `uploaded` → `processed` or `error`,
    with the reason in `status_details`), as OpenAI validates a file after its upload.
    Files and requests go with their key (and its deployment) when an admin deletes it; the
    training sets and jobs made from them stay."""

    id = models.CharField(primary_key=True, max_length=40, default=file_id, editable=False)
    api_key = models.ForeignKey("feedback.ApiKey", on_delete=models.CASCADE, related_name="fine_tuning_files")
    filename = models.CharField(max_length=255)
    purpose = models.CharField(max_length=40)
    content = models.TextField()
    bytes = models.PositiveBigIntegerField(help_text="the upload's size, as OpenAI's file object reports it")
    stored_bytes = models.PositiveBigIntegerField(
        default=0, help_text="what the row still holds of it (0 once a deleted file's content is dropped)"
    )
    status = models.CharField(max_length=20, choices=FileStatus.choices, default=FileStatus.UPLOADED)
    status_details = models.TextField(blank=True, default="")
    summary = models.JSONField(
        default=dict, blank=True, help_text="what reading its lines found: lines, targets, bytes as SFT items"
    )
    created_at = models.DateTimeField(default=timezone.now)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"


class FineTuningJob(models.Model):
    """What a fine-tuning request asked for, beside the training job that carries it out
    (`ftjob-<training job id>`). The training job waits, queued without a training set,
    while a worker reads the files into one (OpenAI's `validating_files`)."""

    job = models.OneToOneField("training.TrainingJob", primary_key=True, on_delete=models.CASCADE, related_name="+")
    api_key = models.ForeignKey("feedback.ApiKey", on_delete=models.CASCADE, related_name="fine_tuning_jobs")
    training_file = models.ForeignKey(FineTuningFile, on_delete=models.CASCADE, related_name="+")
    validation_file = models.ForeignKey(
        FineTuningFile, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    model = models.CharField(max_length=120)
    method = models.JSONField(default=dict)
    hyperparameters = models.JSONField(default=dict)
    suffix = models.CharField(max_length=64, blank=True, default="")
    seed = models.BigIntegerField(default=0)
    metadata = models.JSONField(default=dict, blank=True)
    items_bytes = models.PositiveBigIntegerField(
        default=0, help_text="the training items made from its files (they count against the storage quota)"
    )
    failure = models.JSONField(
        default=dict, blank=True, help_text="why its files could not make a training set: OpenAI's error object"
    )

    class Meta:
        ordering = ["-job_id"]

    def __str__(self) -> str:
        return f"ftjob-{self.job_id}"
