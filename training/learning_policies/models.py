"""Learning policies: per deployment, when to learn from new feedback, how, and what a
candidate must show before a person is asked to put it live.

- `LearningPolicy`: the signal it learns from, the trigger, the job recipe, the evaluation
  and the requirements, and whom to notify.
- `LearningPolicyRun`: one firing, stage by stage (set → job → evaluation → checks) with its
  outcome; at most one unfinished run per policy.
- `LearningPolicyUse`: each comment, customer feedback, judgement or episode a run trained
  on, unique per policy, so a policy never learns from the same thing twice.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.utils import timezone

from training.serving.models import Deployment


class PolicySignal(models.TextChoices):
    COMMENTS = "comments", "Operator comments"
    CUSTOMER = "customer", "Customer feedback"
    JUDGE = "judge", "Judge rewards (while the judge's training gate is open)"
    EPISODES = "episodes", "Graded episodes of an environment"


class LearningPolicy(models.Model):
    """What the periodic tick (`learning_policies_tick`) does for one deployment. It trains
    from the live version, evaluates the candidate against it and, when every requirement
    holds, opens a promotion request as `created_by` (whoever created or last changed it);
    it never puts anything live."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="learning_policies")
    name = models.SlugField(max_length=100)
    enabled = models.BooleanField(default=True)
    signal = models.CharField(max_length=10, choices=PolicySignal.choices, default=PolicySignal.COMMENTS)
    environment = models.CharField(
        max_length=100, blank=True, default="", help_text="episodes: the environment whose graded episodes it learns"
    )
    # Trigger: both hold before it fires; 0 leaves one out (not both).
    min_new_turns = models.PositiveIntegerField(default=10, help_text="fire after this many new turns with the signal")
    min_interval_minutes = models.PositiveIntegerField(default=0, help_text="and at least this long since the last run")
    # Recipe: a training job's kind and settings, validated as the jobs page does.
    job_kind = models.CharField(max_length=10, default="distill")
    job_config = models.JSONField(default=dict, blank=True)
    heldout_fraction = models.FloatField(default=0.2)
    # Evaluation: held-out items of a fixed set (else the run's own set), and/or episodes.
    eval_training_set = models.ForeignKey(
        "training.TrainingSet", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    eval_environment = models.CharField(max_length=100, blank=True, default="")
    eval_environment_split = models.CharField(max_length=20, blank=True, default="")
    eval_environment_tasks = models.PositiveIntegerField(null=True, blank=True)
    # Requirements (harm, monitors, canaries and regressions are the promotion's own checks).
    min_win_rate = models.FloatField(default=0.5)
    min_win_rate_ci_low = models.FloatField(
        null=True, blank=True, help_text="the win rate's 95% lower bound must be above this (blank: not required)"
    )
    require_no_regressions = models.BooleanField(
        default=True, help_text="every promotion signal (canaries, held-out curve, …) within its threshold"
    )
    require_monitors_clean = models.BooleanField(default=True)
    notify_group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    notify_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Why the last tick did not fire, shown on the page instead of a run row per tick.
    waiting_reason = models.CharField(max_length=500, blank=True, default="")
    checked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["deployment_id", "name"]
        verbose_name_plural = "learning policies"
        constraints = [
            models.UniqueConstraint(fields=["deployment", "name"], name="learningpolicy_name_unique"),
            models.CheckConstraint(
                condition=models.Q(heldout_fraction__gte=0, heldout_fraction__lt=1), name="learningpolicy_heldout_range"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.deployment_id})"


class RunStage(models.TextChoices):
    TRAINING = "training", "Training"
    EVALUATING = "evaluating", "Evaluating"
    DONE = "done", "Done"


class RunOutcome(models.TextChoices):
    NONE = "", "In progress"
    REQUESTED = "requested", "Promotion request opened"
    CHECKS_FAILED = "checks_failed", "Requirements not met"
    ERROR = "error", "Error"


class LearningPolicyRun(models.Model):
    """One firing of a policy. The tick moves it on when its job or evaluation finished."""

    policy = models.ForeignKey(LearningPolicy, on_delete=models.CASCADE, related_name="runs")
    fired_at = models.DateTimeField(default=timezone.now)
    reason = models.CharField(max_length=500, help_text="why it fired")
    stage = models.CharField(max_length=12, choices=RunStage.choices, default=RunStage.TRAINING)
    outcome = models.CharField(max_length=15, choices=RunOutcome.choices, blank=True, default=RunOutcome.NONE)
    training_set = models.ForeignKey(
        "training.TrainingSet", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Counts of what the set was built from: comments, customer_feedback, judge_results, episodes, turns.
    provenance = models.JSONField(default=dict, blank=True)
    job = models.ForeignKey("training.TrainingJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    evaluation = models.ForeignKey(
        "training.Evaluation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    promotion = models.ForeignKey(
        "training.PromotionRequest", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Each requirement as checked: {code, label, ok, detail}.
    checks = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True, default="")
    notified = models.JSONField(default=list, blank=True, help_text="usernames told of the request")
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-fired_at", "-id"]
        constraints = [
            # Two ticks (or two beat processes) racing cannot both fire a policy.
            models.UniqueConstraint(
                fields=["policy"], condition=models.Q(finished_at__isnull=True), name="learningpolicyrun_one_active"
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.pk} of {self.policy_id} ({self.stage}{', ' + self.outcome if self.outcome else ''})"

    @property
    def is_active(self) -> bool:
        return self.finished_at is None


class UseKind(models.TextChoices):
    COMMENT = "comment", "Comment"
    CUSTOMER = "customer", "Customer feedback"
    JUDGE = "judge", "Judge result"
    EPISODE = "episode", "Episode trace"


class LearningPolicyUse(models.Model):
    """A piece of feedback a run trained on."""

    policy = models.ForeignKey(LearningPolicy, on_delete=models.CASCADE, related_name="uses")
    run = models.ForeignKey(LearningPolicyRun, on_delete=models.CASCADE, related_name="uses")
    kind = models.CharField(max_length=10, choices=UseKind.choices)
    object_id = models.BigIntegerField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["policy", "kind", "object_id"], name="learningpolicyuse_once"),
        ]

    def __str__(self) -> str:
        return f"{self.policy_id}:{self.kind}:{self.object_id}"
