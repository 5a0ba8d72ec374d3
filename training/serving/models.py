"""Deployments, the base models and versions that can serve them, and each deployment's
live pointer.

The tables keep the names they had before this app existed (`feedback_deployment`,
`training_modelversion`, …): the models moved here in migration state only, so no row was
copied and no table renamed (docs/decisions/0020-domains-and-layers.md).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from webapp.kernel.append_only import AppendOnly, AppendOnlyQuerySet


class Deployment(models.Model):
    """A named agent in production, e.g. "support-bot"."""

    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Gateway calls that name no trace continue the conversation whose logged history they
    # repeat (see feedback/services/stitching.py); off: every such call is a trace of its own.
    stitch_conversations = models.BooleanField(
        default=True,
        help_text="Join gateway calls that send no trace id into conversations by their message history.",
    )

    class Meta:
        ordering = ["name"]
        db_table = "feedback_deployment"

    def __str__(self) -> str:
        return self.name


class BaseModel(models.Model):
    """A local folder of Hugging Face weights (no hub downloads happen at run time)."""

    name = models.SlugField(max_length=100, unique=True)
    path = models.CharField(max_length=500)
    description = models.TextField(blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    inference_url = models.CharField(
        max_length=300,
        blank=True,
        default="",
        help_text="The inference server serving this base model (and its adapters); blank: the default one.",
    )
    # Servers beside `inference_url` that serve the same weights: the gateway spreads requests
    # over all of them, and a release loads into each. Set by `serve_inference --replicas` or
    # `manage.py inference_replicas` (through `base_model_replicas_set`, which validates them).
    inference_replicas = models.JSONField(
        default=list,
        blank=True,
        help_text="More inference servers of this base model (http:// URLs), beside inference_url.",
    )

    class Meta:
        ordering = ["name"]
        db_table = "training_basemodel"

    def __str__(self) -> str:
        return self.name


class ModelVersionKind(models.TextChoices):
    BASE = "base", "Base weights"
    LORA = "lora", "LoRA adapter"
    FULL = "full", "Full checkpoint"


class ModelVersionStatus(models.TextChoices):
    CANDIDATE = "candidate", "Candidate"
    APPROVED = "approved", "Approved"
    LIVE = "live", "Live"
    RETIRED = "retired", "Retired"
    FAILED = "failed", "Failed"


class ModelVersion(models.Model):
    """A servable version: the base weights themselves, a LoRA adapter over them, or a
    full checkpoint. `name` is what the inference server and the gateway call it."""

    name = models.SlugField(max_length=120, unique=True)
    base_model = models.ForeignKey(BaseModel, on_delete=models.PROTECT, related_name="versions")
    kind = models.CharField(max_length=10, choices=ModelVersionKind.choices)
    path = models.CharField(max_length=500)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="children")
    deployment = models.ForeignKey(
        Deployment,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="model_versions",
        help_text="The deployment whose data this version was trained for, if any.",
    )
    status = models.CharField(max_length=20, choices=ModelVersionStatus.choices, default=ModelVersionStatus.CANDIDATE)
    metadata = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        db_table = "training_modelversion"

    def __str__(self) -> str:
        return self.name


class LiveVersion(models.Model):
    """The live pointer: the deployment is the primary key, so the database holds at
    most one live version per deployment, and flipping it is a single-row update."""

    deployment = models.OneToOneField(Deployment, primary_key=True, on_delete=models.CASCADE, related_name="live")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="live_for")
    changed_at = models.DateTimeField(default=timezone.now)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        db_table = "training_liveversion"

    def __str__(self) -> str:
        return f"{self.deployment_id} → {self.version_id}"


class LiveChangeKind(models.TextChoices):
    """How the live pointer moved: what decides whether the version it left may come back
    without a new approval (`training.serving.selectors.live_withdrawals`)."""

    PROMOTION = "promotion", "Promotion (an approved request)"
    ROLLBACK = "rollback", "Rollback"
    SET = "set", "Set by a command"


class LiveVersionChangeQuerySet(AppendOnlyQuerySet):
    refused = "the trail of live moves is append-only"


class LiveVersionChange(AppendOnly, models.Model):
    """The trail of a deployment's live pointer: one row for every move, whatever its route
    (a release, a progressive release completing, a command): who, when, from what, to what,
    how (`kind`) and why (`reason`). It is the one record of what went live: written only by
    `training.serving.services.live_version_set`, in the move's transaction, and shown by the
    audit log among its events. Append-only (on PostgreSQL a trigger refuses an UPDATE but an
    account's deletion blanking `changed_by`); a deployment with a move cannot be deleted."""

    # PROTECT: the trail is the only record of a move made by a command, so a deployment that
    # ever went live keeps it (as the audit log's rows keep theirs).
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="live_changes")
    from_version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    to_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    changed_at = models.DateTimeField(default=timezone.now)
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reason = models.CharField(max_length=300, blank=True, default="")
    kind = models.CharField(max_length=10, choices=LiveChangeKind.choices, default=LiveChangeKind.SET)
    # The promotion request and the release behind a move, by id: serving sits below the app
    # that keeps them (`training.promotion`). Blank for a command's move.
    promotion_id = models.PositiveBigIntegerField(null=True, blank=True)
    release_id = models.PositiveBigIntegerField(null=True, blank=True)

    objects = LiveVersionChangeQuerySet.as_manager()
    edit_refused = "the trail of live moves is append-only: a move cannot be changed"
    delete_refused = "the trail of live moves is append-only: a move cannot be deleted"

    class Meta:
        ordering = ["-changed_at", "-id"]
        db_table = "training_liveversionchange"
        indexes = [models.Index(fields=["deployment", "-changed_at"], name="live_change_dep_idx")]

    def __str__(self) -> str:
        return f"{self.deployment_id}: {self.from_version_id} → {self.to_version_id}"


class CanarySplit(models.Model):
    """A share of a deployment's conversations served by a candidate beside the live version:
    the current step of a progressive release (`training.promotion.rollout_models.Rollout`).
    The deployment is the primary key, so at most one candidate takes traffic at a time.

    Which conversations: those whose key hashes below `share` (`feedback.gateway.split`), so
    every gateway process routes a conversation alike without asking any other."""

    deployment = models.OneToOneField(Deployment, primary_key=True, on_delete=models.CASCADE, related_name="canary")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="canary_for")
    share = models.FloatField(help_text="the fraction of conversations the candidate serves, above 0 and below 1")
    # The rollout behind the split, by id: serving sits below the app that keeps rollouts.
    rollout_id = models.PositiveBigIntegerField()
    changed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "serving_canarysplit"
        constraints = [
            models.CheckConstraint(condition=models.Q(share__gt=0, share__lt=1), name="canarysplit_share_range"),
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id}: {self.version_id} at {self.share:.0%}"
