"""Policy notes: a short written rule a deployment's judge proposes from many operators'
comments, which an operator edits and an approver approves. Every edit is a new version;
the judge reads a note's approved version only (`PolicyNote.approved_version`), so a
note nobody approved is never used. Approvals are written to the audit log by
`training.policy_notes.services`.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from feedback.models.review import Comment
from training.serving.models import Deployment


class PolicyNoteAuthor(models.TextChoices):
    JUDGE = "judge", "Proposed by the judge"
    PERSON = "person", "Edited by a person"


class PolicyNote(models.Model):
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="policy_notes")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    # What the judge reads; null until a version is approved. A later edit leaves it as it is
    # until that edit is approved in turn.
    approved_version = models.ForeignKey(
        "PolicyNoteVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"policy note {self.pk} of {self.deployment_id}"


class PolicyNoteVersion(models.Model):
    note = models.ForeignKey(PolicyNote, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    text = models.TextField(help_text="the rule in words, as the judge reads it")
    # `training.environments.policy_rules` format; null when the rule is only words.
    rule = models.JSONField(null=True, blank=True)
    # The comments the proposal was drawn from, in the judge's reading of them.
    supporting = models.ManyToManyField(Comment, blank=True, related_name="+")
    contradicting = models.ManyToManyField(Comment, blank=True, related_name="+")
    read_comments = models.PositiveIntegerField(default=0, help_text="how many comments the judge read")
    author_kind = models.CharField(max_length=10, choices=PolicyNoteAuthor.choices)
    written_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    judge_model = models.CharField(max_length=200, blank=True, default="")
    prompt_version = models.CharField(max_length=100, blank=True, default="")
    raw_output = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    approved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    approved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["note", "-number"]
        constraints = [models.UniqueConstraint(fields=["note", "number"], name="policynoteversion_unique_number")]

    def __str__(self) -> str:
        return f"policy note {self.note_id} v{self.number}"
