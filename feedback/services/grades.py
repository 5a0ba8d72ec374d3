"""Grades: a grader's verdict on a trace, sent by the agent's harness (its own tests, an
environment's check of the final state) with a trace at ingest (`"grades": [...]` on an
item) or afterwards (`POST /api/v1/grades`), as Langfuse scores or LangSmith feedback with a
`source` are.

A grade is `{"outcome": "success" | "failure", "score": 0-1 (optional), "reason": text,
"source": who graded, "name": what was graded (default "outcome")}`. A trace holds one grade
per name: sending one again replaces it (a retry is harmless). The trace's outcome, shown and
filtered on the list, follows its grades: a failure when any grade failed, else a success;
the reason shown on hover is the deciding grade's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from feedback.models import ApiKey, Grade, GradeOutcome, Trace
from feedback.services.customer_feedback import feedback_target_find
from training.serving.models import Deployment
from webapp.kernel.chat_format import FieldError

DEFAULT_NAME = "outcome"
MAX_GRADES_PER_TRACE = 20
MAX_REASON_CHARS = 20_000
MAX_SOURCE_CHARS = 100
REASON_SHOWN_CHARS = 300  # the trace row keeps this much of the deciding reason, for the list
GRADE_KEYS = {"name", "outcome", "score", "reason", "source"}
_NAME = re.compile(r"[-a-zA-Z0-9_]{1,100}")


@dataclass(frozen=True, slots=True)
class GradeIn:
    name: str
    outcome: str
    score: float | None
    reason: str
    source: str


def _text(value: Any, field: str, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise FieldError(field, "must be a string")
    if len(value) > limit:
        raise FieldError(field, f"{len(value)} characters; at most {limit}")
    if "\x00" in value:
        raise FieldError(field, "contains a NUL character")
    return value.strip()


def grade_parse(value: Any, *, field: str = "", default_source: str = "api", extra: Iterable[str] = ()) -> GradeIn:
    """One grade from a request; a `FieldError` names the field (after `field.`) and why.
    `extra`: other keys the object may carry (a target's ids), which are not the grade's."""
    prefix = f"{field}." if field else ""
    if not isinstance(value, dict):
        raise FieldError(field, 'a grade is an object: {"outcome": "success" or "failure", …}')
    unknown = sorted(set(map(str, value)) - GRADE_KEYS - set(extra))
    if unknown:
        raise FieldError(
            prefix + unknown[0][:100], f"not a field of a grade (those are {', '.join(sorted(GRADE_KEYS))})"
        )
    outcome = value.get("outcome")
    if outcome not in GradeOutcome.values:
        raise FieldError(prefix + "outcome", "required: 'success' or 'failure'")
    score = value.get("score")
    if score is not None:
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise FieldError(prefix + "score", "a number from 0 to 1")
        if not 0 <= score <= 1:
            raise FieldError(prefix + "score", f"{score} is outside 0 to 1")
        score = float(score)
    name = value.get("name", DEFAULT_NAME)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise FieldError(prefix + "name", "letters, digits, - and _ (at most 100)")
    source = _text(value.get("source"), prefix + "source", MAX_SOURCE_CHARS) or default_source
    return GradeIn(
        name=name,
        outcome=outcome,
        score=score,
        reason=_text(value.get("reason"), prefix + "reason", MAX_REASON_CHARS),
        source=source,
    )


def grades_parse(value: Any, *, field: str = "grades", default_source: str = "api") -> list[GradeIn]:
    """A trace item's `grades` array (each name once)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise FieldError(field, "an array of grades")
    if len(value) > MAX_GRADES_PER_TRACE:
        raise FieldError(field, f"{len(value)} grades; at most {MAX_GRADES_PER_TRACE} per trace")
    grades = [grade_parse(g, field=f"{field}[{i}]", default_source=default_source) for i, g in enumerate(value)]
    names = [g.name for g in grades]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise FieldError(f"{field}[{i}].name", f"{name!r} appears twice; a trace holds one grade per name")
    return grades


@transaction.atomic
def grades_write(
    *,
    deployment_id: int,
    grades: Sequence[tuple[int, GradeIn]],
    api_key: ApiKey | None = None,
    now: datetime | None = None,
) -> None:
    """Store (trace id, grade) pairs, each replacing the trace's grade of the same name, and
    bring those traces' outcomes up to date."""
    if not grades:
        return
    now = now or timezone.now()
    Grade.objects.bulk_create(
        [
            Grade(
                deployment_id=deployment_id,
                trace_id=trace_id,
                name=g.name,
                outcome=g.outcome,
                score=g.score,
                reason=g.reason,
                source=g.source,
                api_key=api_key,
                created_at=now,
                updated_at=now,
            )
            for trace_id, g in grades
        ],
        update_conflicts=True,
        unique_fields=["trace", "name"],
        update_fields=["outcome", "score", "reason", "source", "api_key", "updated_at"],
    )
    trace_outcomes_refresh(trace_ids=sorted({trace_id for trace_id, _ in grades}))


def trace_outcome_of(grades: Iterable[Grade]) -> tuple[str, str, float | None]:
    """(outcome, reason, score) of a trace from its grades: the latest failing grade's when
    any failed, else the latest passing one's; ("", "", None) without grades."""
    latest: dict[str, Grade] = {}
    for g in grades:
        kept = latest.get(g.outcome)
        if kept is None or (g.updated_at, g.pk) > (kept.updated_at, kept.pk):
            latest[g.outcome] = g
    deciding = latest.get(GradeOutcome.FAILURE) or latest.get(GradeOutcome.SUCCESS)
    if deciding is None:
        return "", "", None
    reason = deciding.reason
    if len(reason) > REASON_SHOWN_CHARS:
        reason = reason[: REASON_SHOWN_CHARS - 1] + "…"
    return deciding.outcome, reason, deciding.score


def trace_outcomes_refresh(*, trace_ids: Sequence[int]) -> None:
    """Write the outcome columns of these traces from their grades (two queries and an update
    per trace whose outcome changed)."""
    by_trace: dict[int, list[Grade]] = {t: [] for t in trace_ids}
    for g in Grade.objects.filter(trace_id__in=trace_ids).only("trace_id", "outcome", "score", "reason", "updated_at"):
        by_trace[g.trace_id].append(g)
    changed = []
    for trace in Trace.objects.filter(pk__in=trace_ids).only("id", "outcome", "outcome_reason", "outcome_score"):
        now = trace_outcome_of(by_trace.get(trace.pk, []))
        if now != (trace.outcome, trace.outcome_reason, trace.outcome_score):
            trace.outcome, trace.outcome_reason, trace.outcome_score = now
            changed.append(trace)
    if changed:
        Trace.objects.bulk_update(changed, ["outcome", "outcome_reason", "outcome_score"])


@transaction.atomic
def grade_record(
    *, deployment: Deployment, data: Any, api_key: ApiKey | None = None, now: datetime | None = None
) -> tuple[Grade, bool]:
    """Validate and store one grade sent on its own (`POST /api/v1/grades`): the body names
    its trace by `trace_id` or `external_id`. Returns the grade and whether it is new (a grade
    of that name on the trace is replaced)."""
    if not isinstance(data, dict):
        raise FieldError("", "the body must be a JSON object")
    if data.get("response_id"):
        raise FieldError("response_id", "a grade is on a whole trace: give trace_id or external_id")
    grade = grade_parse(data, extra=("trace_id", "external_id", "response_id"))
    target = feedback_target_find(
        deployment=deployment, trace_id=data.get("trace_id"), external_id=data.get("external_id")
    )
    existed = Grade.objects.filter(trace=target.trace, name=grade.name).exists()
    grades_write(deployment_id=deployment.pk, grades=[(target.trace.pk, grade)], api_key=api_key, now=now)
    return Grade.objects.get(trace=target.trace, name=grade.name), not existed
