"""Training sets and jobs (the models, versions and live pointers they use are `training.serving`'s)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from training.serving.models import Deployment, ModelVersion
from webapp.work import WorkItem, WorkStatus


class TrainingSet(models.Model):
    """A versioned set of items to train on, built from traces and their feedback (or
    replayable tasks). Rebuilding with the same name makes the next version; every item
    keeps the ids it came from."""

    name = models.SlugField(max_length=100)
    version = models.PositiveIntegerField(default=1)
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="training_sets"
    )
    description = models.TextField(blank=True)
    # How the set was selected (the dashboard's filters or a saved queue), to rebuild it.
    selection = models.JSONField(default=dict, blank=True)
    heldout_fraction = models.FloatField(default=0.2)
    # An evaluation slice made from a failure mode (every item held out): at most one per
    # cluster. `selection` keeps the cluster's name and run for when a later run replaces it.
    failure_cluster = models.ForeignKey(
        "feedback.FailureCluster", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    item_count = models.PositiveIntegerField(default=0)
    train_count = models.PositiveIntegerField(default=0)
    heldout_count = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["name", "version"], name="trainingset_name_version_unique"),
            models.CheckConstraint(
                condition=models.Q(heldout_fraction__gte=0, heldout_fraction__lt=1), name="trainingset_heldout_range"
            ),
            models.UniqueConstraint(
                fields=["failure_cluster"],
                condition=models.Q(failure_cluster__isnull=False),
                name="trainingset_one_slice_per_failure_cluster",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    @property
    def evaluable(self) -> bool:
        """Whether an evaluation can use the set: it holds items out of training."""
        return self.heldout_count > 0

    @property
    def choice_label(self) -> str:
        """The set as every dropdown that lists sets names it: with its split, and marked
        when nothing is held out to evaluate on."""
        label = f"{self} — {self.train_count} train / {self.heldout_count} held out"
        return label if self.evaluable else f"{label} (cannot be evaluated: nothing held out)"


class TrainingItemKind(models.TextChoices):
    TURN = "turn", "Logged turn"
    TASK = "task", "Replayable task"


class TrainingSplit(models.TextChoices):
    TRAIN = "train", "Train"
    HELDOUT = "heldout", "Held out"


class CorrectionSource(models.TextChoices):
    NONE = "", "None"
    HUMAN = "human", "Operator"
    JUDGE = "judge", "Judge"
    CUSTOMER = "customer", "Customer"


class TrainingItem(models.Model):
    """One assistant turn in its logged context (kind "turn"), or a replayable task with a
    programmatic grader (kind "task"). `key` is stable across rebuilds (it names the
    turn, not the row), and the split is a hash of it, so an item never moves between
    train and held-out when the set is rebuilt."""

    training_set = models.ForeignKey(TrainingSet, on_delete=models.CASCADE, related_name="items")
    kind = models.CharField(max_length=10, choices=TrainingItemKind.choices, default=TrainingItemKind.TURN)
    key = models.CharField(max_length=300)
    split = models.CharField(max_length=10, choices=TrainingSplit.choices, default=TrainingSplit.TRAIN)
    messages = models.JSONField(help_text="the context up to the turn, in the OpenAI chat format")
    tools = models.JSONField(null=True, blank=True)
    rubric = models.JSONField(null=True, blank=True, help_text="the judge's rubric for this turn")
    feedback = models.TextField(blank=True, default="", help_text="the critique, used as a self-distillation hint")
    logged_response = models.JSONField(null=True, blank=True, help_text="the assistant message as served")
    reward = models.FloatField(null=True, blank=True, help_text="the logged response's reward under the rubric")
    corrected_response = models.TextField(blank=True, default="")
    correction_source = models.CharField(
        max_length=10, choices=CorrectionSource.choices, blank=True, default=CorrectionSource.NONE
    )
    reference = models.TextField(blank=True, default="", help_text="tasks: the reference answer")
    grader = models.CharField(max_length=50, blank=True, default="", help_text="tasks: a grader name")
    trace = models.ForeignKey(
        "feedback.Trace", null=True, blank=True, on_delete=models.SET_NULL, related_name="training_items"
    )
    message = models.ForeignKey(
        "feedback.Message", null=True, blank=True, on_delete=models.SET_NULL, related_name="training_items"
    )
    # Ids of what the item was built from: comments, ratings, corrections, judge results…
    provenance = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["training_set_id", "id"]
        constraints = [
            models.UniqueConstraint(fields=["training_set", "key"], name="trainingitem_key_unique"),
        ]
        indexes = [models.Index(fields=["training_set", "split"], name="trainingitem_set_split_idx")]

    def __str__(self) -> str:
        return f"{self.training_set_id}:{self.key}"


class JobKind(models.TextChoices):
    GRPO = "grpo", "GRPO"
    DISTILL = "distill", "Self-distillation (feedback hint)"
    SFT = "sft", "SFT on corrections"
    EPISODES = "episodes", "Full-episode GRPO (environment)"


# What a job does, phase by phase (`TrainingJob.phase["name"]`), in words.
PHASE_LABELS = {
    "queued": "waiting for a worker",
    "validating_files": "reading its fine-tuning files",
    "loading": "loading the model",
    "evaluation": "evaluating",
    "sampling": "sampling",
    "update": "updating the weights",
    "export": "exporting the trained model",
    "registration": "registering the candidate version",
    "done": "done",
}


class TrainingJob(WorkItem):
    """A training run on the `training` queue. The row is the source of truth: status,
    config, heartbeat, progress, latest metrics and the last checkpoint."""

    # A cancelled job checkpoints before it stops: its worker holds it while cancelling.
    HELD_STATUSES = (WorkStatus.RUNNING, WorkStatus.CANCELLING)

    kind = models.CharField(max_length=10, choices=JobKind.choices)
    config = models.JSONField(help_text="the job's typed config (training.trainer.config), as JSON")
    training_set = models.ForeignKey(TrainingSet, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")
    base_version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="training_jobs")
    result_version = models.OneToOneField(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="produced_by_job"
    )
    deployment = models.ForeignKey(
        Deployment, null=True, blank=True, on_delete=models.SET_NULL, related_name="training_jobs"
    )
    step = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField(default=0)
    metrics = models.JSONField(default=dict, blank=True, help_text="the latest step's metrics")
    eval_metrics = models.JSONField(default=dict, blank=True, help_text="the first and latest evaluation")
    phase = models.JSONField(
        default=dict,
        blank=True,
        help_text="what the job is doing now: name (loading, evaluation, sampling, update, export, "
        "registration), done, total, since",
    )
    flagged = models.BooleanField(default=False, help_text="a reward-hacking monitor fired")
    breaches = models.JSONField(default=list, blank=True)
    checkpoint_path = models.CharField(max_length=500, blank=True, default="")
    checkpoint_step = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "heartbeat_at"], name="trainingjob_status_hb_idx")]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} job {self.pk} ({self.status})"

    @property
    def progress(self) -> float:
        return self.step / self.total_steps if self.total_steps else 0.0

    @property
    def phase_label(self) -> str:
        name = (self.phase or {}).get("name", "")
        return PHASE_LABELS.get(name, name)


class JobEventKind(models.TextChoices):
    STEP = "step", "Step metrics"
    EVAL = "eval", "Evaluation"
    SAMPLE = "sample", "Sample rollouts"
    LOG = "log", "Log line"
    BREACH = "breach", "Monitor breach"


class TrainingJobEvent(models.Model):
    """What a job reports as it runs: one row per step's metrics, evaluation, batch of
    sample rollouts, log line or monitor breach. The job page's charts read the steps."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=10, choices=JobEventKind.choices)
    step = models.PositiveIntegerField(default=0)
    data = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["job_id", "id"]
        indexes = [models.Index(fields=["job", "kind", "step"], name="jobevent_job_kind_step_idx")]

    def __str__(self) -> str:
        return f"{self.job_id} {self.kind}@{self.step}"


class GapProbe(models.Model):
    """One measurement of a model version's student-teacher gap: how far an operator's
    comment in its context raises P(right action) on decision contexts
    (`training.trainer.gap_probe`). Distillation and hinted GRPO are offered for a version
    only where its latest gap reaches PRACTICUM_TRAINING_MIN_HINT_GAP."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="gap_probes")
    environment = models.CharField(max_length=100, default="support-desk")
    split = models.CharField(max_length=20, default="train")
    hint_at = models.CharField(max_length=10, default="system")
    n = models.PositiveIntegerField()
    p_with = models.FloatField(help_text="mean P(right action) with the comment in context")
    p_without = models.FloatField(help_text="mean P(right action) without it")
    gap = models.FloatField()
    per_kind = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["version", "-created_at"], name="gapprobe_version_idx")]

    def __str__(self) -> str:
        return f"gap {self.gap:+.3f} of {self.version_id} (n={self.n})"


# Django registers an app's models from its `models` module; promotion's live in
# `training/promotion/models.py` and learning policies' in `training/learning_policies/models.py`
# (app label `training`, the same tables), imported here only
# so they are registered. Callers import them from there.
import training.learning_policies.models  # noqa: E402
import training.promotion.models  # noqa: E402
import training.promotion.rollout_models  # noqa: E402, F401
