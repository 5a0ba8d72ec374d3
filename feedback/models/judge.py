"""The judge's results and the failure-mode pipeline's runs.

A `JudgeResult` is one judgement of one assistant turn: the rubric the feedback implies,
the reward of the logged response under it, the rationale, and (when the feedback says
what the answer should have been) a judge-written corrected response. Re-judging adds a
row; old rows stay, and `is_latest` marks the one training and the trace list use.
"""

from __future__ import annotations

import re

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from feedback.models.policy_notes import PolicyNoteVersion
from feedback.models.review import Comment, Correction, CustomerFeedback
from feedback.models.traces import Message, Trace
from training.serving.models import Deployment
from webapp.kernel.work import WorkItem, WorkStatus


class JudgeStatus(models.TextChoices):
    """A judgement's statuses (also those of a scoring call and an order-swap check). Running
    and failed are the shared lifecycle's own values: its claim and its sweep write them."""

    PENDING = "pending", "Pending"
    RUNNING = WorkStatus.RUNNING.value, "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = WorkStatus.FAILED.value, "Failed"


class JudgeTrigger(models.TextChoices):
    COMMENT = "comment", "Operator comment"
    CUSTOMER_FEEDBACK = "customer_feedback", "Customer feedback"
    BACKFILL = "backfill", "Backfill batch"
    MANUAL = "manual", "Requested by hand"


class CorrectionMode(models.TextChoices):
    TEXT = "text", "Written by the judge"
    ACTIONS = "actions", "Chosen among the agent's actions"


class SchemaMode(models.TextChoices):
    FULL = "full", "Full schema (vLLM, grammar backends)"
    PORTABLE = "portable", "Without length/range bounds (strict hosted APIs)"


# The environment variables a deployment's judge may take its key from: ones named for that
# purpose, never any other (an admin could otherwise send SECRET_KEY or a database password as
# a Bearer token to a URL of their choice). The settings' own judge key may be named too.
JUDGE_KEY_ENV_PREFIX = "PRACTICUM_JUDGE_KEY_"
JUDGE_DEFAULT_KEY_ENV = "PRACTICUM_JUDGE_API_KEY"
_KEY_ENV_NAME = re.compile(r"[A-Z0-9_]+")


def judge_key_env_check(name: str) -> None:
    """Raise ValidationError unless `name` (blank: no key) is a variable a judge key may be
    read from."""
    if not name:
        return
    if name == JUDGE_DEFAULT_KEY_ENV or (
        name.startswith(JUDGE_KEY_ENV_PREFIX)
        and len(name) > len(JUDGE_KEY_ENV_PREFIX)
        and _KEY_ENV_NAME.fullmatch(name)
    ):
        return
    raise ValidationError(
        {
            "api_key_env": f"{name[:100]!r} is not a judge key variable: use a name that starts with "
            f"{JUDGE_KEY_ENV_PREFIX} (capitals, digits, _), or {JUDGE_DEFAULT_KEY_ENV}"
        }
    )


class DeploymentJudge(models.Model):
    """A deployment's own judge endpoint, used instead of the settings' one. The API key
    is not stored: `api_key_env` names the environment variable that holds it."""

    deployment = models.OneToOneField(
        Deployment, primary_key=True, on_delete=models.CASCADE, related_name="judge_endpoint"
    )
    base_url = models.URLField(max_length=500, help_text="e.g. https://api.openai.com/v1 or http://vllm:8000/v1")
    model = models.CharField(max_length=200)
    api_key_env = models.CharField(
        max_length=100, blank=True, default="", help_text="name of the environment variable holding the API key"
    )
    schema_mode = models.CharField(max_length=10, choices=SchemaMode.choices, default=SchemaMode.FULL)
    correction_mode = models.CharField(
        max_length=10,
        choices=CorrectionMode.choices,
        default=CorrectionMode.TEXT,
        help_text="how the judge gives the corrected turn: written, or chosen among the agent's tools "
        "(ids copied from the conversation) and a reply, under structured output",
    )
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "deployment judge endpoint"

    def __str__(self) -> str:
        return f"{self.deployment_id}: {self.model} at {self.base_url}"

    def clean(self) -> None:
        judge_key_env_check(self.api_key_env)


class JudgeJob(WorkItem):
    """A backfill batch: judge every feedback-bearing assistant turn that matches."""

    deployment = models.ForeignKey(Deployment, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    only_unjudged = models.BooleanField(
        default=True, help_text="skip turns that already have a judgement by the current judge version"
    )
    since = models.DateTimeField(null=True, blank=True)
    limit = models.PositiveIntegerField(default=1000)
    judge_model = models.CharField(max_length=200, blank=True, default="")
    prompt_version = models.CharField(max_length=100, blank=True, default="")
    # The turns to judge, fixed when the job starts, so a resumed job does the same work.
    message_ids = models.JSONField(default=list, blank=True)
    total = models.PositiveIntegerField(default=0)
    succeeded = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"judge job {self.pk} ({self.status})"

    @property
    def done(self) -> int:
        return self.succeeded + self.failed

    @property
    def percent(self) -> int:
        return round(100 * self.done / self.total) if self.total else (100 if self.status == WorkStatus.FINISHED else 0)


class JudgeResult(WorkItem):
    """One judgement of one assistant turn, with everything needed to audit it. Claimed,
    ended and swept as a `WorkItem`, under its own names for waiting (`pending`) and
    finishing well (`succeeded`); `error` says why it failed (`failure_reason` in the API)."""

    QUEUED_STATUS = JudgeStatus.PENDING

    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="judge_results")
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="judge_results")
    job = models.ForeignKey(JudgeJob, null=True, blank=True, on_delete=models.SET_NULL, related_name="results")
    trigger = models.CharField(max_length=20, choices=JudgeTrigger.choices)
    # The feedback the judge was shown (all of it on the turn at the time it ran).
    comments = models.ManyToManyField(Comment, blank=True, related_name="judge_results")
    customer_feedback = models.ManyToManyField(CustomerFeedback, blank=True, related_name="judge_results")
    human_corrections = models.ManyToManyField(Correction, blank=True, related_name="judge_results")
    # The approved policy notes of the deployment the judge read with it.
    policy_notes = models.ManyToManyField(PolicyNoteVersion, blank=True, related_name="judge_results")

    status = models.CharField(max_length=20, choices=JudgeStatus.choices, default=JudgeStatus.PENDING)
    judge_model = models.CharField(max_length=200, blank=True, default="")
    served_model = models.CharField(max_length=200, blank=True, default="")
    judge_base_url = models.CharField(max_length=500, blank=True, default="")
    prompt_version = models.CharField(max_length=100, blank=True, default="")

    rubric = models.JSONField(null=True, blank=True)
    reward = models.FloatField(null=True, blank=True)
    rationale = models.TextField(blank=True, default="")
    # The self-distillation target, written by the judge (human corrections are `Correction`s).
    corrected_response = models.TextField(blank=True, default="")
    # In "actions" mode, the action the judge chose ({"kind": "tool", "name", "arguments"} or
    # {"kind": "reply", "text"}); `corrected_response` is it rendered as the agent writes it.
    action = models.JSONField(null=True, blank=True)
    guard_reason = models.TextField(
        blank=True, default="", help_text="set when the logged turn had no content: the reward is then 0"
    )

    raw_output = models.TextField(blank=True, default="")
    # Each request of the judge call (its error, raw output, finish reason); `attempts` is the
    # lifecycle's count of worker starts.
    call_attempts = models.JSONField(default=list, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cost = models.FloatField(null=True, blank=True)

    is_latest = models.BooleanField(default=False)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Older than the lifecycle: `requested_by` names the person, not a second column.
    created_by = None

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["message"], condition=models.Q(is_latest=True), name="judgeresult_one_latest_per_turn"
            ),
            models.CheckConstraint(
                condition=models.Q(reward__isnull=True) | models.Q(reward__gte=0, reward__lte=1),
                name="judgeresult_reward_in_unit_interval",
            ),
        ]
        indexes = [
            models.Index(fields=["message", "-created_at"], name="judgeresult_message_idx"),
            models.Index(fields=["judge_model", "prompt_version", "status"], name="judgeresult_version_idx"),
            models.Index(fields=["status", "-created_at"], name="judgeresult_status_idx"),
        ]

    def __str__(self) -> str:
        return f"judgement {self.pk} of {self.message_id} ({self.status})"

    @property
    def judge_version(self) -> str:
        return f"{self.judge_model} · {self.prompt_version}"


class ScoringPurpose(models.TextChoices):
    TRAINING = "training", "A training job's reward"
    CALIBRATION = "calibration", "Agreement calibration on a rated turn"


class CandidateScoring(models.Model):
    """One `score_candidates` call: a training job scoring a group of samples, or a
    calibration scoring a rated turn for the training gate. Kept like a judgement: the
    judge model, the prompt version, the raw output of every attempt, tokens and cost."""

    purpose = models.CharField(max_length=20, choices=ScoringPurpose.choices)
    deployment = models.ForeignKey(Deployment, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    # The training job (by id: training sits above feedback) or the rated turn calibrated.
    training_job_id = models.PositiveBigIntegerField(null=True, blank=True, db_index=True)
    step = models.IntegerField(null=True, blank=True)
    item_key = models.CharField(max_length=300, blank=True, default="")
    message = models.ForeignKey(Message, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    status = models.CharField(max_length=20, choices=JudgeStatus.choices)
    failure_reason = models.TextField(blank=True, default="")
    judge_model = models.CharField(max_length=200, blank=True, default="")
    served_model = models.CharField(max_length=200, blank=True, default="")
    judge_base_url = models.CharField(max_length=500, blank=True, default="")
    prompt_version = models.CharField(max_length=100, blank=True, default="")
    rubric = models.JSONField(null=True, blank=True)
    candidates = models.PositiveIntegerField(default=0)
    scores = models.JSONField(default=list, blank=True)
    presented = models.JSONField(default=list, blank=True)
    raw_output = models.TextField(blank=True, default="")
    attempts = models.JSONField(default=list, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    cost = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["purpose", "judge_model", "prompt_version", "status"], name="scoring_version_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.purpose} scoring {self.pk} ({self.status})"


class OrderSwapCheck(models.Model):
    """The logged turn and a correction scored twice, in both orders, under a judgement's
    rubric: a judge that prefers whatever it sees first disagrees with itself."""

    result = models.ForeignKey(JudgeResult, on_delete=models.CASCADE, related_name="swap_checks")
    judge_model = models.CharField(max_length=200)
    judge_base_url = models.CharField(max_length=500, blank=True, default="")
    prompt_version = models.CharField(max_length=100)
    status = models.CharField(max_length=20, choices=JudgeStatus.choices, default=JudgeStatus.PENDING)
    failure_reason = models.TextField(blank=True, default="")
    first_order = models.JSONField(default=list, blank=True)
    first_scores = models.JSONField(default=list, blank=True)
    second_scores = models.JSONField(default=list, blank=True)
    pair_agreement = models.FloatField(null=True, blank=True)
    mean_abs_diff = models.FloatField(null=True, blank=True)
    latency_ms = models.FloatField(null=True, blank=True)
    cost = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["judge_model", "prompt_version", "status"], name="swapcheck_version_idx")]

    def __str__(self) -> str:
        return f"order-swap check {self.pk} of judgement {self.result_id}"


class FailureModeRun(WorkItem):
    """One pass of the failure-mode pipeline over a batch of traces."""

    deployment = models.ForeignKey(Deployment, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    since = models.DateTimeField(null=True, blank=True)
    until = models.DateTimeField(null=True, blank=True)
    max_traces = models.PositiveIntegerField(default=10000)
    stage = models.CharField(max_length=40, blank=True, default="")
    progress_done = models.PositiveIntegerField(default=0)
    progress_total = models.PositiveIntegerField(default=0)
    traces_scanned = models.PositiveIntegerField(default=0)
    traces_flagged = models.PositiveIntegerField(default=0)
    flags_written = models.PositiveIntegerField(default=0)
    notes_clustered = models.PositiveIntegerField(default=0)
    flag_counts = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"failure-mode run {self.pk} ({self.status})"

    @property
    def percent(self) -> int:
        if self.progress_total:
            return round(100 * self.progress_done / self.progress_total)
        return 100 if self.status == WorkStatus.FINISHED else 0


class FailureCluster(models.Model):
    """A group of similar failure notes (operators' comments, judge rationales), named."""

    run = models.ForeignKey(FailureModeRun, on_delete=models.CASCADE, related_name="clusters")
    rank = models.PositiveIntegerField(help_text="0 for the largest cluster")
    name = models.CharField(max_length=100)
    flag_name = models.SlugField(max_length=100)
    description = models.TextField(blank=True, default="")
    named_by = models.CharField(
        max_length=20,
        help_text="judge; comments when the judge's name was unreadable; keywords when the judge could not name it; "
        "person when renamed",
    )
    naming_error = models.TextField(blank=True, default="")
    judge_model = models.CharField(max_length=200, blank=True, default="")
    prompt_version = models.CharField(max_length=100, blank=True, default="")
    size = models.PositiveIntegerField(default=0)
    trace_count = models.PositiveIntegerField(default=0)
    examples = models.JSONField(default=list, blank=True)
    # A person dismissed it (not a failure mode): its flags were taken off its traces.
    dismissed_at = models.DateTimeField(null=True, blank=True)
    dismissed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["run_id", "rank"]

    def __str__(self) -> str:
        return self.name


class FailureClusterMember(models.Model):
    cluster = models.ForeignKey(FailureCluster, on_delete=models.CASCADE, related_name="members")
    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="+")
    comment = models.ForeignKey(Comment, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    judge_result = models.ForeignKey(JudgeResult, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    text = models.TextField()

    def __str__(self) -> str:
        return f"{self.cluster_id}: {self.text[:40]}"
