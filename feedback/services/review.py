"""Operators' work on a trace: comments, turn ratings and corrections.

Validation failures raise `FieldError(field, reason)`; acting on someone else's comment
or correction raises `PermissionDenied`. Each writer keeps `Trace.has_comment` in step.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.utils import timezone
from django.utils.crypto import get_random_string

from feedback.models import Comment, Correction, Message, MessageRole, RatingKind, Trace, TurnRating
from feedback.schema_validation import tool_arguments_error, tool_parameter_schemas
from feedback.services.judging import judge_on_comment
from webapp.kernel.chat_format import FieldError, json_depth_check

MAX_COMMENT_CHARS = 20_000
MAX_CORRECTION_CHARS = 100_000
MAX_TOOL_CALLS = 32
# What the pages state beside each free-text field.
REVIEW_LIMITS = {"comment": MAX_COMMENT_CHARS, "correction": MAX_CORRECTION_CHARS, "note": MAX_COMMENT_CHARS}


def _no_nul(value: str, field: str) -> str:
    # PostgreSQL text cannot hold NUL characters; refuse them instead of failing the write.
    if "\x00" in value:
        raise FieldError(field, "contains a NUL character")
    return value


def _body(value: str, field: str = "body", *, limit: int = MAX_COMMENT_CHARS) -> str:
    value = _no_nul((value or "").strip(), field)
    if not value:
        raise FieldError(field, "required; write what went wrong")
    if len(value) > limit:
        raise FieldError(field, f"{len(value)} characters; at most {limit}")
    return value


def quote_span(
    *, content: str, quote_start: int | None, quote_end: int | None, quote: str = ""
) -> tuple[int | None, int | None, str]:
    """Check a quoted span against the message text. With offsets, they must lie in the
    text (and match `quote` when both are given); with only `quote`, its first occurrence."""
    if quote_start is None and quote_end is None:
        if not quote:
            return None, None, ""
        at = content.find(quote)
        if at < 0:
            raise FieldError("quote", "not found in the message")
        return at, at + len(quote), quote
    if quote_start is None or quote_end is None:
        raise FieldError("quote_start" if quote_start is None else "quote_end", "give both offsets or neither")
    if not (0 <= quote_start < quote_end <= len(content)):
        raise FieldError("quote_end", f"the span {quote_start}-{quote_end} is outside the message (0-{len(content)})")
    span = content[quote_start:quote_end]
    if quote and span != quote:
        # The browser counted offsets differently (e.g. around astral characters): trust the
        # text the person selected if it occurs in the message.
        return quote_span(content=content, quote_start=None, quote_end=None, quote=quote)
    return quote_start, quote_end, span


@transaction.atomic
def comment_add(
    *,
    message: Message,
    author,
    body: str,
    quote_start: int | None = None,
    quote_end: int | None = None,
    quote: str = "",
    now: datetime | None = None,
) -> Comment:
    start, end, span = quote_span(content=message.content, quote_start=quote_start, quote_end=quote_end, quote=quote)
    comment = Comment.objects.create(
        trace_id=message.trace_id,
        message=message,
        author=author,
        body=_body(body),
        quote=span,
        quote_start=start,
        quote_end=end,
        created_at=now or timezone.now(),
    )
    Trace.objects.filter(pk=message.trace_id, has_comment=False).update(has_comment=True)
    judge_on_comment(comment=comment)
    return comment


def _own(obj, user, what: str) -> None:
    author_id = obj.author_id
    if author_id is None or author_id != user.pk:
        raise PermissionDenied(f"only the author can change this {what}")


def comment_edit(*, comment: Comment, user, body: str, now: datetime | None = None) -> Comment:
    _own(comment, user, "comment")
    comment.body = _body(body)
    comment.edited_at = now or timezone.now()
    comment.save(update_fields=["body", "edited_at"])
    return comment


@transaction.atomic
def comment_delete(*, comment: Comment, user) -> None:
    _own(comment, user, "comment")
    trace_id = comment.trace_id
    comment.delete()
    if not Comment.objects.filter(trace_id=trace_id).exists():
        Trace.objects.filter(pk=trace_id).update(has_comment=False)


def comment_resolve(*, comment: Comment, user, resolved: bool = True, now: datetime | None = None) -> Comment:
    """Mark a comment resolved (or open again); anyone who may comment may do this."""
    comment.resolved_at = (now or timezone.now()) if resolved else None
    comment.resolved_by = user if resolved else None
    comment.save(update_fields=["resolved_at", "resolved_by"])
    return comment


def _assistant(message: Message, what: str) -> None:
    if message.role != MessageRole.ASSISTANT:
        raise FieldError("message", f"only assistant turns can be {what}; this is a {message.role} message")


def rating_parse(kind: str, value: Any) -> tuple[str, int]:
    """Validate a rating: kind `thumbs` with value up/down (or ±1), kind `score` with 1-5."""
    if kind == RatingKind.THUMBS:
        mapping = {"up": 1, "down": -1, "1": 1, "-1": -1, 1: 1, -1: -1}
        if value not in mapping:
            raise FieldError("value", "thumbs take 'up' or 'down'")
        return kind, mapping[value]
    if kind == RatingKind.SCORE:
        try:
            score = int(value)
        except (TypeError, ValueError):
            score = 0
        if isinstance(value, bool) or not 1 <= score <= 5 or str(value).strip() != str(score):
            raise FieldError("value", "a score is a whole number from 1 to 5")
        return kind, score
    raise FieldError("kind", "one of thumbs, score")


def turn_rating_set(*, message: Message, user, kind: str, value: Any, now: datetime | None = None) -> TurnRating:
    """Set this person's rating of an assistant turn (replacing their earlier one)."""
    _assistant(message, "rated")
    kind, value = rating_parse(kind, value)
    now = now or timezone.now()
    rating, _ = TurnRating.objects.update_or_create(
        message=message,
        user=user,
        defaults={"trace_id": message.trace_id, "kind": kind, "value": value, "updated_at": now},
        create_defaults={
            "trace_id": message.trace_id,
            "kind": kind,
            "value": value,
            "created_at": now,
            "updated_at": now,
        },
    )
    return rating


def turn_rating_clear(*, message: Message, user) -> None:
    TurnRating.objects.filter(message=message, user=user).delete()


def correction_tool_calls_validate(*, trace: Trace, tool_calls: Any) -> list[dict[str, Any]] | None:
    """Tool calls of a correction in the chat format: each names a tool the trace defines and
    has arguments (a JSON object, or its string form) that satisfy that tool's parameters."""
    if tool_calls in (None, []):
        return None
    if not isinstance(tool_calls, list):
        raise FieldError("tool_calls", "must be an array")
    if len(tool_calls) > MAX_TOOL_CALLS:
        raise FieldError("tool_calls", f"at most {MAX_TOOL_CALLS} tool calls")
    schemas = tool_parameter_schemas(trace.tools)
    if not schemas:
        raise FieldError("tool_calls", "this trace defines no tools, so a correction cannot call one")
    out = []
    for i, call in enumerate(tool_calls):
        here = f"tool_calls[{i}]"
        if not isinstance(call, dict):
            raise FieldError(here, "must be an object")
        function = call.get("function", call)
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise FieldError(f"{here}.function.name", "required")
        if name not in schemas:
            raise FieldError(
                f"{here}.function.name", f"unknown tool {name[:80]!r}; this trace defines {', '.join(sorted(schemas))}"
            )
        arguments = function.get("arguments", {})
        json_depth_check(arguments, f"{here}.function.arguments")
        if isinstance(arguments, str):
            _no_nul(arguments, f"{here}.function.arguments")
            try:
                arguments = orjson.loads(arguments) if arguments.strip() else {}
            except orjson.JSONDecodeError as exc:
                raise FieldError(f"{here}.function.arguments", f"not valid JSON: {exc}") from exc
        if not isinstance(arguments, dict):
            raise FieldError(f"{here}.function.arguments", "must be a JSON object")
        error = tool_arguments_error(schemas[name], arguments)
        if error is not None:
            where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
            raise FieldError(f"{here}.function.arguments{where}", error.message[:300])
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else None
        out.append(
            {
                "id": call_id or f"call_{get_random_string(12)}",
                "type": "function",
                "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
            }
        )
    return out


def _note(note: str) -> str:
    note = _no_nul((note or "").strip(), "note")
    if len(note) > MAX_COMMENT_CHARS:
        raise FieldError("note", f"{len(note)} characters; at most {MAX_COMMENT_CHARS}")
    return note


def _correction_fields(*, trace: Trace, content: str, tool_calls: Any) -> tuple[str, list | None]:
    content = _no_nul((content or "").strip(), "content")
    if len(content) > MAX_CORRECTION_CHARS:
        raise FieldError("content", f"{len(content)} characters; at most {MAX_CORRECTION_CHARS}")
    calls = correction_tool_calls_validate(trace=trace, tool_calls=tool_calls)
    if not content and not calls:
        raise FieldError("content", "write the response the agent should have given, or at least one tool call")
    return content, calls


def correction_add(
    *, message: Message, author, content: str = "", tool_calls: Any = None, note: str = "", now: datetime | None = None
) -> Correction:
    """Store the response an assistant turn should have been, beside the original."""
    _assistant(message, "corrected")
    content, calls = _correction_fields(trace=message.trace, content=content, tool_calls=tool_calls)
    now = now or timezone.now()
    return Correction.objects.create(
        trace_id=message.trace_id,
        message=message,
        author=author,
        content=content,
        tool_calls=calls,
        note=_note(note),
        created_at=now,
        updated_at=now,
    )


def correction_update(
    *,
    correction: Correction,
    user,
    content: str = "",
    tool_calls: Any = None,
    note: str = "",
    now: datetime | None = None,
) -> Correction:
    _own(correction, user, "correction")
    correction.content, correction.tool_calls = _correction_fields(
        trace=correction.trace, content=content, tool_calls=tool_calls
    )
    correction.note = _note(note)
    correction.updated_at = now or timezone.now()
    correction.save(update_fields=["content", "tool_calls", "note", "updated_at"])
    return correction


def correction_delete(*, correction: Correction, user) -> None:
    _own(correction, user, "correction")
    correction.delete()
