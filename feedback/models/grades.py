"""Grades: a grader's verdict on a trace — the environment's check of an episode, an agent's
own test suite, a script's assertion. Not customer feedback: a grade says whether the task
was done, by a program that knows the answer, and is kept apart from what people said.

A trace has at most one grade per `name` (a second one replaces it, as a score with the same
name does in Langfuse); the trace's denormalised `outcome` follows its grades (see
`feedback.services.grades`).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from feedback.models.traces import ApiKey, GradeOutcome, Trace
from training.serving.models import Deployment


class Grade(models.Model):
    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="+", db_index=False)
    # The unique (trace, name) index serves lookups by trace.
    trace = models.ForeignKey(Trace, on_delete=models.CASCADE, related_name="grades", db_index=False)
    name = models.SlugField(max_length=100, default="outcome", db_index=False)
    outcome = models.CharField(max_length=10, choices=GradeOutcome.choices)
    score = models.FloatField(null=True, blank=True, help_text="the grader's number on [0, 1], if it gives one")
    reason = models.TextField(blank=True, default="")
    source = models.CharField(max_length=100, default="api", help_text="who graded: an environment, a test suite…")
    api_key = models.ForeignKey(ApiKey, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created_at", "id"]
        constraints = [
            models.UniqueConstraint(fields=["trace", "name"], name="grade_one_per_name"),
            models.CheckConstraint(condition=models.Q(outcome__in=GradeOutcome.values), name="grade_outcome_valid"),
            models.CheckConstraint(
                condition=models.Q(score__isnull=True) | models.Q(score__gte=0, score__lte=1),
                name="grade_score_range",
            ),
        ]
        indexes = [models.Index(fields=["deployment", "created_at"], name="grade_dep_created_idx")]

    def __str__(self) -> str:
        return f"{self.name}={self.outcome} on {self.trace_id}"

    @property
    def reward(self) -> float:
        """The score, or 1 for a success and 0 for a failure when the grader gave none."""
        if self.score is not None:
            return self.score
        return 1.0 if self.outcome == GradeOutcome.SUCCESS else 0.0
