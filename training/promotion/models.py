"""Evaluation, promotion, release and their audit log.

- `Evaluation`: a candidate version against the deployment's live version on held-out
  items; `EvaluationItem` keeps each item's context and both versions' responses and
  scores, so the report can show every item side by side.
- `PromotionRequest`: someone asks that a candidate go live for a deployment; another
  person with `training.approve_promotion` approves or rejects it.
- `Release`: the worker's job of putting a version live (load, smoke request, flip), for a
  promotion or a rollback; a work item like evaluations, its `step` saying where a running
  one is. The row is the source of truth for the page's live status.
- `AuditEvent`: append-only; every step above writes one, and so does every change a
  signed-in person makes to an account or a role (`training.services.accounts`). Rows
  cannot be changed or deleted through the ORM (and on PostgreSQL a trigger refuses UPDATE
  and DELETE). A move of the live pointer is not one of them: it is a row of the pointer's
  own trail (`training.serving.models.LiveVersionChange`), which the audit log shows among
  its events (`training.promotion.selectors.audit_trail`).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from training.serving.models import Deployment, ModelVersion
from webapp.kernel.append_only import AppendOnly, AppendOnlyQuerySet
from webapp.kernel.work import WorkItem, WorkStatus


class Evaluation(WorkItem):
    """A candidate scored against a baseline (the live version when it was created)."""

    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="evaluations")
    candidate = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="evaluations")
    baseline = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="+")
    training_set = models.ForeignKey(
        "training.TrainingSet",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="evaluations",
        help_text="whose held-out items were evaluated, if any",
    )
    config = models.JSONField(default=dict, blank=True, help_text="generation and scoring settings, as run")
    sources = models.JSONField(default=dict, blank=True, help_text="where the items came from")
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    summary = models.JSONField(default=dict, blank=True, help_text="both versions' figures and the win rate")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["candidate", "deployment", "-created_at"], name="evaluation_cand_dep_idx")]

    def __str__(self) -> str:
        return f"evaluation {self.pk}: {self.candidate_id} vs {self.baseline_id}"


class EvaluationItemKind(models.TextChoices):
    TURN = "turn", "Logged turn"
    TASK = "task", "Replayable task"
    EPISODE = "episode", "Whole episode"


class Outcome(models.TextChoices):
    """The candidate's result against the baseline on one item."""

    NONE = "", "Not compared"
    WIN = "win", "Candidate better"
    TIE = "tie", "Tie"
    LOSS = "loss", "Baseline better"


class EvaluationItem(models.Model):
    """One held-out item: its context, and each version's response and scores.

    `candidate`/`baseline` hold per-side results: the assistant message (`content`,
    `tool_calls`), `finish_reason`, `tokens`, `chars`, `reward`, `reason`, `graded`,
    `tool_calls_seen`, `tool_calls_invalid`, `empty`, `refusal`, `truncated`, `error`; for
    an episode item also `episode`, `success`, `end`, `turns`, `transcript` and its audit,
    `collateral_changes` and `unknown_ids` (see `EpisodeAudit`)."""

    evaluation = models.ForeignKey(Evaluation, on_delete=models.CASCADE, related_name="items")
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=EvaluationItemKind.choices, default=EvaluationItemKind.TURN)
    key = models.CharField(max_length=300)
    source = models.JSONField(default=dict, blank=True, help_text="ids it came from (training item, trace, message)")
    messages = models.JSONField(help_text="the context, in the OpenAI chat format")
    tools = models.JSONField(null=True, blank=True)
    rubric = models.JSONField(null=True, blank=True)
    reference = models.TextField(blank=True, default="")
    grader = models.CharField(max_length=50, blank=True, default="")
    logged_response = models.JSONField(null=True, blank=True)
    done = models.BooleanField(default=False)
    candidate = models.JSONField(default=dict, blank=True)
    baseline = models.JSONField(default=dict, blank=True)
    outcome = models.CharField(max_length=5, choices=Outcome.choices, blank=True, default=Outcome.NONE)
    judge_error = models.TextField(blank=True, default="")
    kl = models.FloatField(null=True, blank=True, help_text="k3 estimate per token of KL(candidate ‖ baseline)")

    class Meta:
        ordering = ["evaluation_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["evaluation", "position"], name="evaluationitem_position_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.evaluation_id}#{self.position}"


class PromotionStatus(models.TextChoices):
    PENDING = "pending", "Waiting for approval"
    APPROVED = "approved", "Approved, deploying"
    DEPLOYED = "deployed", "Deployed"
    FAILED = "failed", "Deployment failed"
    REJECTED = "rejected", "Rejected"
    CANCELLED = "cancelled", "Withdrawn"
    ROLLED_BACK = "rolled_back", "Rolled back"


class PromotionRequest(models.Model):
    """A request that `candidate` become the live version of `deployment`."""

    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="promotions")
    candidate = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="promotions")
    from_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+", help_text="live when asked"
    )
    evaluation = models.ForeignKey(Evaluation, on_delete=models.PROTECT, related_name="promotions")
    status = models.CharField(max_length=12, choices=PromotionStatus.choices, default=PromotionStatus.PENDING)
    note = models.TextField(blank=True, default="")
    breach_override_reason = models.TextField(
        blank=True, default="", help_text="why a monitor breach of the training job does not block this"
    )
    rebase_reason = models.TextField(
        blank=True, default="", help_text="why a candidate not built from the live version may replace it"
    )
    regression_override_reason = models.TextField(
        blank=True, default="", help_text="why a signal that regresses beyond its threshold does not block this"
    )
    # What the requester saw: the training job's monitors and the judge's agreement figures.
    snapshot = models.JSONField(default=dict, blank=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    requested_at = models.DateTimeField(default=timezone.now)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_comment = models.TextField(blank=True, default="")
    # What the approver saw when deciding (the same figures, at that moment).
    decision_snapshot = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-requested_at", "-id"]
        # Deciding a promotion is promotion's permission (it was hung on ModelVersion's
        # content type before the serving app existed; migration training 0012 moved it).
        permissions = [("approve_promotion", "Can approve the promotion of a model version")]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "candidate"],
                condition=models.Q(status="pending"),
                name="promotion_one_pending_per_candidate",
            ),
        ]

    def __str__(self) -> str:
        return f"promotion {self.pk}: {self.candidate_id} → {self.deployment_id}"


class ReleaseKind(models.TextChoices):
    PROMOTION = "promotion", "Promotion"
    ROLLBACK = "rollback", "Rollback"


class ReleaseStep(models.TextChoices):
    """Where a release is: the step it is on while running, the last one it reached once
    it ended."""

    NONE = "", "Not started"
    LOADING = "loading", "Loading weights"
    SMOKE_TEST = "smoke_test", "Smoke test"
    SWITCH = "switch", "Switching the live pointer"
    # Finished without flipping: a progressive release routes its first step's share instead.
    CANARY = "canary", "Serving a share of traffic"


class Release(WorkItem):
    """Putting `version` live for `deployment` on the inference server: load it, send a
    smoke request, flip the live pointer. A work item (`webapp.kernel.work`): queued, running
    (through `step`), then finished (the pointer flipped, in the same transaction), failed
    or cancelled; any end but finished leaves `from_version` live."""

    deployment = models.ForeignKey(Deployment, on_delete=models.PROTECT, related_name="releases")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="releases")
    from_version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=10, choices=ReleaseKind.choices, default=ReleaseKind.PROMOTION)
    promotion = models.ForeignKey(
        PromotionRequest, null=True, blank=True, on_delete=models.PROTECT, related_name="releases"
    )
    step = models.CharField(max_length=12, choices=ReleaseStep.choices, blank=True, default=ReleaseStep.NONE)
    reason = models.CharField(max_length=500, blank=True, default="")
    smoke = models.JSONField(default=dict, blank=True, help_text="the smoke request and what came back")
    # Milliseconds from queueing to each step, for the page and the approval-to-serving figure.
    timings = models.JSONField(default=dict, blank=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Who asked is `requested_by` (older than the lifecycle, and PROTECT): no second column for it.
    created_by = None

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # One release at a time per deployment: two racing flips would make "previous" meaningless.
            models.UniqueConstraint(
                fields=["deployment"],
                condition=models.Q(status__in=[WorkStatus.QUEUED, WorkStatus.RUNNING]),
                name="release_one_active_per_deployment",
            ),
        ]

    def __str__(self) -> str:
        return f"release {self.pk}: {self.version_id} → {self.deployment_id} ({self.state})"

    def _canary_end(self) -> tuple[str, str] | None:
        """Where a release that routed a progressive release's first step stands once that
        rollout ended: live once complete, rolled back (or failed); None while it runs. The
        rollout's state, not the release's step, says so: the step stays where the worker left it."""
        from training.promotion.rollout_models import ACTIVE_STATES, RolloutState  # noqa: PLC0415 — it imports this module

        rollout = next(iter(self.rollouts.all()), None)  # one; a prefetch serves it
        if rollout is None or rollout.state in ACTIVE_STATES:
            return None
        if rollout.state == RolloutState.COMPLETE:
            return "live", "Live"
        return rollout.state, rollout.get_state_display()

    @property
    def state(self) -> str:
        """What the pages show and style: the step while running, "live" once finished,
        else the status."""
        if self.status == WorkStatus.RUNNING:
            return self.step or WorkStatus.RUNNING
        if self.status == WorkStatus.FINISHED:
            if self.step != ReleaseStep.CANARY:
                return "live"
            ended = self._canary_end()
            return ended[0] if ended else "canary"
        return self.status

    def get_state_display(self) -> str:
        if self.status == WorkStatus.RUNNING:
            return self.get_step_display() if self.step else WorkStatus.RUNNING.label
        if self.status == WorkStatus.FINISHED:
            if self.step != ReleaseStep.CANARY:
                return "Live"
            ended = self._canary_end()
            return ended[1] if ended else ReleaseStep.CANARY.label
        return self.get_status_display()


class AuditAction(models.TextChoices):
    EVALUATION_STARTED = "evaluation_started", "Evaluation started"
    EVALUATION_FINISHED = "evaluation_finished", "Evaluation finished"
    EVALUATION_FAILED = "evaluation_failed", "Evaluation failed"
    EVALUATION_CANCELLED = "evaluation_cancelled", "Evaluation cancelled"
    PROMOTION_REQUESTED = "promotion_requested", "Promotion requested"
    PROMOTION_WITHDRAWN = "promotion_withdrawn", "Promotion withdrawn"
    PROMOTION_APPROVED = "promotion_approved", "Promotion approved"
    PROMOTION_REJECTED = "promotion_rejected", "Promotion rejected"
    ROLLBACK_REQUESTED = "rollback_requested", "Rollback requested"
    RELEASE_LOADED = "release_loaded", "Weights loaded"
    RELEASE_SMOKE_PASSED = "release_smoke_passed", "Smoke test passed"
    # No longer written: a move of the live pointer is a row of the pointer's own trail
    # (`training.serving.models.LiveVersionChange`), which the audit log shows under this
    # action; the events written before it stay, and the pages show the trail's row instead.
    LIVE_SWITCHED = "live_switched", "Live version switched"
    RELEASE_FAILED = "release_failed", "Release failed"
    JUDGE_GATE_OVERRIDDEN = "judge_gate_overridden", "Judge training gate overridden"
    # People and roles (`training.services.accounts`): who changed whose account.
    ACCOUNT_CREATED = "account_created", "Account created"
    ACCOUNT_CHANGED = "account_changed", "Account changed"
    ROLES_CHANGED = "roles_changed", "Roles changed"
    PASSWORD_SET = "password_set", "Password set"
    ACCOUNT_DELETED = "account_deleted", "Account deleted"
    ROLE_CHANGED = "role_changed", "Role's permissions changed"
    # Policy notes (`training.policy_notes`): the version the deployment's judge now reads.
    POLICY_NOTE_APPROVED = "policy_note_approved", "Policy note approved"
    # A deployment's judge (`feedback.services.judging.deployment_judge_set`): its endpoint,
    # or how it gives corrected turns, which decides what the training gate asks of it.
    JUDGE_CHANGED = "judge_changed", "Deployment judge changed"
    # A progressive release's step or state moved (`training.promotion.services.rollouts`), by a person
    # or by the automatic check; its own log (`RolloutChange`) keeps the signals it read.
    ROLLOUT_CHANGED = "rollout_changed", "Progressive release changed"


class AuditEventQuerySet(AppendOnlyQuerySet):
    refused = "the audit log is append-only"


class AuditEvent(AppendOnly, models.Model):
    """One step of evaluation, promotion, release or rollback: who, when, what, from
    which version to which; or a change to a person's account or roles (no deployment;
    `data` names the account: `user_id`, `username`). Append-only."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="blank: the system (a worker)",
    )
    # Kept as text too, so the row reads the same if the account is renamed.
    actor_name = models.CharField(max_length=150, blank=True, default="")
    action = models.CharField(max_length=30, choices=AuditAction.choices)
    deployment = models.ForeignKey(
        Deployment,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="blank: no deployment (an override of the settings' judge for data of none)",
    )
    from_version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    to_version = models.ForeignKey(ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    evaluation = models.ForeignKey(Evaluation, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    promotion = models.ForeignKey(
        PromotionRequest, null=True, blank=True, on_delete=models.PROTECT, related_name="audit_events"
    )
    release = models.ForeignKey(Release, null=True, blank=True, on_delete=models.PROTECT, related_name="audit_events")
    detail = models.TextField(blank=True, default="")
    data = models.JSONField(default=dict, blank=True)

    objects = AuditEventQuerySet.as_manager()
    edit_refused = "the audit log is append-only: an event cannot be changed"
    delete_refused = "the audit log is append-only: an event cannot be deleted"

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["deployment", "-at"], name="audit_deployment_at_idx")]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor_name or 'system'} {self.action}"
