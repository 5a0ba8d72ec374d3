"""Failure flags on traces, as the failure-mode pipeline (or a person) sets them."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.utils import timezone

from feedback.models import Trace, TraceFlag
from webapp.kernel.chat_format import FieldError


def trace_flag_set(*, trace: Trace, name: str, source: str = "", detail: str = "") -> TraceFlag:
    """Flag a trace with a failure mode (a slug); setting it again updates source and detail."""
    try:
        validate_slug(name)
    except ValidationError as exc:
        raise FieldError("name", "letters, digits, '-' and '_' only") from exc
    if len(name) > 100:
        raise FieldError("name", "at most 100 characters")
    flag, _ = TraceFlag.objects.update_or_create(
        trace=trace,
        name=name,
        defaults={"source": source[:40], "detail": detail},
        create_defaults={
            "source": source[:40],
            "detail": detail,
            "trace_started_at": trace.started_at,
            "created_at": timezone.now(),
        },
    )
    return flag


def trace_flag_clear(*, trace: Trace, name: str) -> None:
    TraceFlag.objects.filter(trace=trace, name=name).delete()
