"""What a queue asks of its reviewers: instructions, a rubric and score dimensions (like
Langfuse's score configs: a name, a type — a number in a range, one of some categories, or
yes/no — and a description), and each reviewer's scores of an item per dimension.

Dimensions are written one a line, in the queue form's words:

    helpfulness: numeric 1-5 | How far the answer solved the customer's problem
    error: categorical wrong-tool, wrong-order, rude, none | The main failure
    resolved: boolean | The customer's request was fully handled

A reviewer scores the items they hold or finished; scoring a dimension again replaces their
score. A dimension that holds scores keeps its name and type: the queue's rubric can be
reworded and dimensions added, but scores are never left meaning something else.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from feedback.models import AnnotationQueue, QueueItem, QueueItemStatus, QueueScore, ScoreDimension, ScoreKind
from webapp.kernel.chat_format import FieldError

MAX_DIMENSIONS = 12
MAX_CATEGORIES = 20
MAX_TEXT_CHARS = 20_000
_LINE = re.compile(
    r"^\s*(?P<name>[^:|]+?)\s*:\s*(?P<kind>[A-Za-z]+)\b\s*(?P<spec>[^|]*?)\s*(?:\|\s*(?P<description>.*))?$"
)
_NAME = re.compile(r"[-a-z0-9_]{1,100}")
_RANGE = re.compile(r"(-?\d+(?:\.\d+)?)\s*(?:-|\u2013|to|\.\.)\s*(-?\d+(?:\.\d+)?)")
_YES = {"yes", "true", "1", "on"}
_NO = {"no", "false", "0", "off"}


class QueueItemNotHeld(Exception):
    """The item is locked by someone else (or already done)."""


@dataclass(frozen=True, slots=True)
class DimensionIn:
    name: str
    kind: str
    min_value: float | None = None
    max_value: float | None = None
    categories: list[str] = field(default_factory=list)
    description: str = ""


def _text(value: str | None, field_name: str) -> str:
    value = (value or "").strip()
    if len(value) > MAX_TEXT_CHARS:
        raise FieldError(field_name, f"{len(value)} characters; at most {MAX_TEXT_CHARS}")
    if "\x00" in value:
        raise FieldError(field_name, "contains a NUL character")
    return value


def score_dimensions_parse(text: str | None) -> list[DimensionIn]:
    """The dimensions written one a line (`name: numeric 1-5 | description`, `name: categorical
    a, b, c | …`, `name: boolean | …`); a `FieldError` on `dimensions` names the line and why."""
    out: list[DimensionIn] = []
    lines = [(n, line) for n, line in enumerate(_text(text, "dimensions").splitlines(), 1) if line.strip()]
    if len(lines) > MAX_DIMENSIONS:
        raise FieldError("dimensions", f"{len(lines)} dimensions; at most {MAX_DIMENSIONS}")
    for n, line in lines:

        def refuse(reason: str, n: int = n) -> FieldError:
            return FieldError("dimensions", f"line {n}: {reason}")

        match = _LINE.match(line)
        if match is None:
            raise refuse("write it as “name: numeric 1-5 | what it means” (or categorical a, b, c; or boolean)")
        name = match["name"].strip().lower().replace(" ", "_")
        if not _NAME.fullmatch(name):
            raise refuse(f"the name {match['name'][:40]!r} may hold letters, digits, - and _ only")
        if name in {d.name for d in out}:
            raise refuse(f"{name!r} is named twice")
        kind, spec, description = match["kind"].lower(), match["spec"].strip(), (match["description"] or "").strip()
        if kind == ScoreKind.NUMERIC:
            bounds = _RANGE.fullmatch(spec)
            if bounds is None:
                raise refuse("a numeric dimension needs its range, e.g. “numeric 1-5”")
            low, high = float(bounds[1]), float(bounds[2])
            if not low < high:
                raise refuse(f"the range {spec} is empty: its low end must be below its high end")
            out.append(DimensionIn(name, kind, low, high, description=description))
        elif kind == ScoreKind.CATEGORICAL:
            categories = [c.strip() for c in spec.split(",") if c.strip()]
            if len(categories) < 2:
                raise refuse(
                    "a categorical dimension needs at least two categories, e.g. “categorical yes, partly, no”"
                )
            if len(categories) > MAX_CATEGORIES or any(len(c) > 100 for c in categories):
                raise refuse(f"at most {MAX_CATEGORIES} categories of at most 100 characters each")
            if len(set(categories)) < len(categories):
                raise refuse("a category is listed twice")
            out.append(DimensionIn(name, kind, categories=categories, description=description))
        elif kind == ScoreKind.BOOLEAN:
            if spec:
                raise refuse("a boolean dimension takes no range or categories (its answers are yes and no)")
            out.append(DimensionIn(name, kind, description=description))
        else:
            raise refuse(f"the type {kind!r} is not one of numeric, categorical, boolean")
    return out


def _dimension_same(existing: ScoreDimension, new: DimensionIn) -> bool:
    return (existing.kind, existing.min_value, existing.max_value, list(existing.categories)) == (
        new.kind,
        new.min_value,
        new.max_value,
        new.categories,
    )


@transaction.atomic
def queue_rubric_set(
    *, queue: AnnotationQueue, instructions: str | None, rubric: str | None, dimensions: str | None
) -> AnnotationQueue:
    """Set a queue's instructions, rubric and dimensions (their text, as the form has it). A
    dimension that holds scores may be reworded (its description) and moved, not dropped or
    given another type or range."""
    queue = AnnotationQueue.objects.select_for_update().get(pk=queue.pk)
    queue.instructions = _text(instructions, "instructions")
    queue.rubric = _text(rubric, "rubric")
    wanted = score_dimensions_parse(dimensions)
    existing = {d.name: d for d in ScoreDimension.objects.filter(queue=queue)}
    scored = dict(
        QueueScore.objects.filter(dimension__queue=queue)
        .values_list("dimension__name")
        .annotate(n=Count("id"))
        .order_by()
    )
    names = {d.name for d in wanted}
    for name, n in scored.items():
        if name not in names:
            raise FieldError("dimensions", f"{name!r} holds {n} score{'s' if n != 1 else ''}: it cannot be removed")
    for new in wanted:
        old = existing.get(new.name)
        if old is not None and old.name in scored and not _dimension_same(old, new):
            raise FieldError(
                "dimensions", f"{new.name!r} holds scores as “{old.spec}”: its type and range cannot change"
            )
    ScoreDimension.objects.filter(queue=queue).exclude(name__in=names).delete()
    for position, new in enumerate(wanted):
        ScoreDimension.objects.update_or_create(
            queue=queue,
            name=new.name,
            defaults={
                "position": position,
                "kind": new.kind,
                "min_value": new.min_value,
                "max_value": new.max_value,
                "categories": new.categories,
                "description": new.description,
            },
        )
    queue.save(update_fields=["instructions", "rubric"])
    return queue


def dimensions_text(queue: AnnotationQueue) -> str:
    """The queue's dimensions in the form's words, to edit them."""
    return "\n".join(
        f"{d.name}: {d.spec}" + (f" | {d.description}" if d.description else "")
        for d in ScoreDimension.objects.filter(queue=queue)
    )


def score_value_parse(dimension: ScoreDimension, raw: str) -> tuple[float | None, str]:
    """(value, label) of a reviewer's answer on `dimension`; a `FieldError` on `scores.<name>`."""
    field_name = f"scores.{dimension.name}"
    raw = (raw or "").strip()
    if dimension.kind == ScoreKind.NUMERIC:
        try:
            value = float(raw)
        except ValueError:
            raise FieldError(field_name, f"a number from {dimension.spec.split(' ', 1)[1]}") from None
        if not math.isfinite(value) or not dimension.min_value <= value <= dimension.max_value:
            raise FieldError(field_name, f"{raw} is outside {dimension.spec.split(' ', 1)[1]}")
        return value, ""
    if dimension.kind == ScoreKind.CATEGORICAL:
        if raw not in dimension.categories:
            raise FieldError(field_name, f"one of {', '.join(dimension.categories)}")
        return None, raw
    if raw.lower() in _YES:
        return 1.0, "yes"
    if raw.lower() in _NO:
        return 0.0, "no"
    raise FieldError(field_name, "yes or no")


def _check_scorer(item: QueueItem, user) -> None:
    holds = item.status == QueueItemStatus.PENDING and item.locked_by_id == user.pk
    finished = item.status == QueueItemStatus.DONE and item.done_by_id == user.pk
    if not (holds or finished):
        raise QueueItemNotHeld("score the items you hold (take one with “Next item”) or have finished")


@transaction.atomic
def queue_item_scores_save(
    *, item: QueueItem, user, values: Mapping[str, str], now: datetime | None = None
) -> list[QueueScore]:
    """Store a reviewer's scores of an item, one per dimension answered (an empty answer
    leaves that dimension unscored, or removes the reviewer's earlier score of it); each
    replaces their earlier one. Every answer is checked before any is stored."""
    now = now or timezone.now()
    item = QueueItem.objects.select_for_update().get(pk=item.pk)
    _check_scorer(item, user)
    dimensions = list(ScoreDimension.objects.filter(queue_id=item.queue_id))
    unknown = sorted(set(values) - {d.name for d in dimensions})
    if unknown:
        raise FieldError(f"scores.{unknown[0][:100]}", "not a dimension of this queue")
    parsed = {d: score_value_parse(d, values[d.name]) for d in dimensions if (values.get(d.name) or "").strip()}
    cleared = [d for d in dimensions if d.name in values and not (values.get(d.name) or "").strip()]
    QueueScore.objects.filter(item=item, user=user, dimension__in=cleared).delete()
    for dimension, (value, label) in parsed.items():
        QueueScore.objects.update_or_create(
            item=item,
            dimension=dimension,
            user=user,
            defaults={"value": value, "label": label, "updated_at": now},
            create_defaults={"value": value, "label": label, "created_at": now, "updated_at": now},
        )
    return list(QueueScore.objects.filter(item=item, user=user).select_related("dimension"))
