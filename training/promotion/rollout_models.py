"""Progressive release: a candidate earns its share of a deployment's traffic step by step.

- `ReleasePlan`: the steps (share of conversations, and the least conversations and minutes
  the candidate serves at each before it may move on) and the thresholds of the live signals
  that decide each step. A plan names its deployment, or none (offered to every deployment);
  one may be its deployment's default, preselected on the approval form.
- `Rollout`: one candidate's walk through a plan, as the approver chose it (the plan is
  copied, so a later edit of the plan changes no rollout under way): its step, its state and
  the evidence the last check read.
- `RolloutChange`: append-only, one row for every change of step or state: who (blank: the
  automatic check), from what to what, and why, with the signals it was decided on.

App label `training` (imported by `training.models`), like the promotion models.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from training.promotion.models import PromotionRequest, Release
from training.serving.models import Deployment, ModelVersion
from webapp.kernel.append_only import AppendOnly, AppendOnlyQuerySet


class ReleasePlan(models.Model):
    deployment = models.ForeignKey(
        Deployment,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="release_plans",
        help_text="blank: offered to every deployment",
    )
    name = models.SlugField(max_length=60)
    description = models.CharField(max_length=300, blank=True, default="")
    # [{"share": 0.05, "min_conversations": 20, "min_minutes": 30}, ...]; the last share is 1.
    steps = models.JSONField()
    # Signal code -> the worsening past which it regresses; a code left out keeps its default.
    thresholds = models.JSONField(default=dict, blank=True)
    is_default = models.BooleanField(
        default=False, help_text="preselected when a request of its deployment is approved"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        app_label = "training"
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["deployment", "name"], name="releaseplan_name_per_deployment"),
        ]

    def __str__(self) -> str:
        return self.name

    def as_chosen(self) -> dict[str, Any]:
        return {"plan_id": self.pk, "name": self.name, "steps": self.steps, "thresholds": self.thresholds}


class RolloutState(models.TextChoices):
    STARTING = "starting", "Loading the candidate"
    RUNNING = "running", "Running"
    HELD = "held", "Held"
    ROLLED_BACK = "rolled_back", "Rolled back"
    COMPLETE = "complete", "Complete"
    FAILED = "failed", "Failed to start"


ACTIVE_STATES = (RolloutState.STARTING, RolloutState.RUNNING, RolloutState.HELD)


class Rollout(models.Model):
    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="rollouts")
    candidate = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="rollouts")
    baseline = models.ForeignKey(
        ModelVersion, on_delete=models.PROTECT, related_name="+", help_text="live when the rollout began"
    )
    promotion = models.ForeignKey(PromotionRequest, on_delete=models.PROTECT, related_name="rollouts")
    # The work item that loads and smoke-tests the candidate on every replica before step 0.
    release = models.ForeignKey(Release, null=True, blank=True, on_delete=models.PROTECT, related_name="rollouts")
    plan = models.JSONField(help_text="the plan as chosen: name, steps, thresholds")
    step = models.PositiveSmallIntegerField(default=0)
    state = models.CharField(max_length=12, choices=RolloutState.choices, default=RolloutState.STARTING)
    step_started_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True, default="", help_text="why it is where it is")
    checked_at = models.DateTimeField(null=True, blank=True)
    # The last automatic check: both versions' figures per signal and what it read as.
    last_check = models.JSONField(default=dict, blank=True)
    # Every check's brief figures (step, share, each signal's two values and interval), oldest
    # first and the latest 500 kept: the release page draws them over time.
    checks = models.JSONField(default=list, blank=True)

    class Meta:
        app_label = "training"
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment"],
                condition=models.Q(state__in=["starting", "running", "held"]),
                name="rollout_one_active_per_deployment",
            ),
        ]

    def __str__(self) -> str:
        return f"rollout {self.pk}: {self.candidate_id} → {self.deployment_id} ({self.state})"

    @property
    def steps(self) -> list[dict[str, Any]]:
        return list(self.plan.get("steps") or [])

    @property
    def share(self) -> float:
        """The candidate's share now: its step's while it serves traffic, else 0 (or 1 once complete)."""
        if self.state == RolloutState.COMPLETE:
            return 1.0
        if self.state in (RolloutState.RUNNING, RolloutState.HELD):
            return float(self.steps[self.step]["share"])
        return 0.0

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES


class RolloutChangeQuerySet(AppendOnlyQuerySet):
    refused = "the rollout's changes are append-only"


class RolloutChange(AppendOnly, models.Model):
    rollout = models.ForeignKey(Rollout, on_delete=models.PROTECT, related_name="changes")
    at = models.DateTimeField(default=timezone.now)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="blank: the automatic check",
    )
    actor_name = models.CharField(max_length=150, default="automatic")
    from_state = models.CharField(max_length=12, choices=RolloutState.choices, blank=True, default="")
    to_state = models.CharField(max_length=12, choices=RolloutState.choices)
    from_step = models.PositiveSmallIntegerField(null=True, blank=True)
    to_step = models.PositiveSmallIntegerField(null=True, blank=True)
    from_share = models.FloatField(null=True, blank=True)
    to_share = models.FloatField(null=True, blank=True)
    reason = models.TextField(blank=True, default="")
    signals = models.JSONField(default=list, blank=True, help_text="the signals as read when it was decided")

    objects = RolloutChangeQuerySet.as_manager()
    edit_refused = "the rollout's changes are append-only: a change cannot be edited"
    delete_refused = "the rollout's changes are append-only: a change cannot be deleted"

    class Meta:
        app_label = "training"
        ordering = ["rollout_id", "at", "id"]

    def __str__(self) -> str:
        return f"rollout {self.rollout_id}: {self.from_state}/{self.from_step} → {self.to_state}/{self.to_step}"
