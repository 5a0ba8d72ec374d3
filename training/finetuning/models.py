"""Uploaded files and the fine-tuning jobs made from them, each owned by a deployment."""

from __future__ import annotations

import secrets

from django.db import models
from django.utils import timezone


def file_id() -> str:
    return f"file-{secrets.token_hex(12)}"


class FineTuningFile(models.Model):
    """A JSONL file uploaded with purpose `fine-tune`. The lines are read when a job is
    made from it (as OpenAI does), so an upload is only checked for size and encoding.
    Files and requests go with their key (and its deployment) when an admin deletes it; the
    training sets and jobs made from them stay."""

    id = models.CharField(primary_key=True, max_length=40, default=file_id, editable=False)
    api_key = models.ForeignKey("feedback.ApiKey", on_delete=models.CASCADE, related_name="fine_tuning_files")
    filename = models.CharField(max_length=255)
    purpose = models.CharField(max_length=40)
    content = models.TextField()
    bytes = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(default=timezone.now)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.id} ({self.filename})"


class FineTuningJob(models.Model):
    """What a fine-tuning request asked for, beside the training job that carries it out
    (`ftjob-<training job id>`)."""

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

    class Meta:
        ordering = ["-job_id"]

    def __str__(self) -> str:
        return f"ftjob-{self.job_id}"
