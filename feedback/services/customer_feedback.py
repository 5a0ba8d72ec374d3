"""Customer feedback, by API key or through a short-lived signed feedback link.

A request names its target by `trace_id`, `external_id` (the agent's own id) or
`response_id` (the completion id the gateway returned; it also pins the assistant turn).
A target outside the key's deployment is reported as not found, like an unknown one.
With an `idempotency_key`, a retried request returns the stored feedback; the same key
with a different request is a conflict. A feedback link takes one answer: replaying it is
refused, saying so.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from django.conf import settings
from django.core import signing
from django.db import IntegrityError, transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce, Least
from django.utils import timezone

from feedback.models import (
    ApiKey,
    CustomerFeedback,
    FeedbackSource,
    Message,
    MessageRole,
    RatingKind,
    Trace,
    rating_sentiment,
)
from feedback.services.judging import judge_on_customer_feedback
from training.serving.models import Deployment
from webapp.kernel.chat_format import FieldError
from webapp.kernel.errors import Conflict, NotFound, Refused
from webapp.kernel.ids import parse_id

MAX_TEXT_CHARS = 20_000
LINK_SALT = "practicum.feedback-link"


class FeedbackTargetNotFound(NotFound):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(reason, field=field)
        self.args = (f"{field}: {reason}",)


class IdempotencyConflict(Conflict):
    field = "idempotency_key"


class FeedbackLinkError(Refused):
    """The link is malformed, tampered with, or expired; the message says which."""

    field = "token"


class FeedbackLinkUsed(FeedbackLinkError):
    """The link already carried its one answer: a link is single-use."""

    status = 409

    def __init__(self) -> None:
        super().__init__("this feedback link has already been used: each link takes one answer")


@dataclass(frozen=True, slots=True)
class ResolvedLink:
    target: FeedbackTarget
    customer_ref: str
    link_id: str  # what makes the link single-use (stored on the feedback it carried)
    used: bool


@dataclass(frozen=True, slots=True)
class FeedbackTarget:
    trace: Trace
    message: Message | None


def feedback_rating_parse(value: Any) -> tuple[str, int | None]:
    """`"up"`/`"down"` (thumbs) or a whole number 1-5 (score); None for no rating."""
    if value is None or value == "":
        return "", None
    if isinstance(value, str) and value.strip().lower() in {"up", "down", "thumbs_up", "thumbs_down"}:
        return RatingKind.THUMBS, 1 if value.strip().lower().endswith("up") else -1
    if isinstance(value, str) and parse_id(value.strip()) is not None:
        value = parse_id(value.strip())
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 5:
        return RatingKind.SCORE, value
    raise FieldError("rating", "'up' or 'down' (thumbs), or a whole number from 1 to 5 (score)")


def _text(data: dict[str, Any], key: str, limit: int = MAX_TEXT_CHARS) -> str:
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise FieldError(key, "must be a string")
    if len(value) > limit:
        raise FieldError(key, f"{len(value)} characters; at most {limit}")
    if "\x00" in value:
        raise FieldError(key, "contains a NUL character")
    return value.strip()


def feedback_target_find(
    *, deployment: Deployment, trace_id: Any = None, external_id: Any = None, response_id: Any = None
) -> FeedbackTarget:
    """The trace (and turn) a request names, within one deployment."""
    given = [k for k, v in (("trace_id", trace_id), ("external_id", external_id), ("response_id", response_id)) if v]
    if len(given) != 1:
        raise FieldError("trace_id", "give exactly one of trace_id, external_id, response_id")
    if response_id:
        if not isinstance(response_id, str) or len(response_id) > 200 or "\x00" in response_id:
            raise FieldError("response_id", "must be a string of at most 200 characters")
        message = (
            Message.objects.select_related("trace")
            .filter(response_id=response_id, role=MessageRole.ASSISTANT, trace__deployment=deployment)
            .first()
        )
        if message is None:
            raise FeedbackTargetNotFound(
                "response_id", f"no response {response_id[:80]!r} in deployment {deployment.name}"
            )
        return FeedbackTarget(message.trace, message)
    if external_id:
        if not isinstance(external_id, str) or "\x00" in external_id:
            raise FieldError("external_id", "must be a string without NUL characters")
        trace = Trace.objects.filter(deployment=deployment, external_id=external_id).first()
        if trace is None:
            raise FeedbackTargetNotFound(
                "external_id", f"no trace {external_id[:80]!r} in deployment {deployment.name}"
            )
        return FeedbackTarget(trace, None)
    pk = parse_id(trace_id)
    if pk is None:
        raise FieldError("trace_id", "must be a trace id (an integer)")
    trace = Trace.objects.filter(deployment=deployment, pk=pk).first()
    if trace is None:
        raise FeedbackTargetNotFound("trace_id", f"no trace {trace_id} in deployment {deployment.name}")
    return FeedbackTarget(trace, None)


def _request_hash(target: FeedbackTarget, fields: dict[str, Any]) -> str:
    body = {"trace": target.trace.pk, "message": target.message.pk if target.message else None, **fields}
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def customer_feedback_create(
    *,
    deployment: Deployment,
    data: dict[str, Any],
    api_key: ApiKey | None = None,
    target: FeedbackTarget | None = None,
    source: str = FeedbackSource.API,
    link_id: str = "",
    now: datetime | None = None,
) -> tuple[CustomerFeedback, bool]:
    """Validate and store one piece of customer feedback; returns it and whether it is new.

    `data` is the request body; `target`, when given (a feedback link), replaces the ids in it.
    `link_id` (a feedback link's): the link takes one answer; another raises `FeedbackLinkUsed`
    (a retry with the first answer's idempotency_key still gets that answer back).
    """
    if not isinstance(data, dict):
        raise FieldError("", "the body must be a JSON object")
    rating_kind, rating = feedback_rating_parse(data.get("rating"))
    fields = {
        "rating_kind": rating_kind,
        "rating": rating,
        "comment": _text(data, "comment"),
        "correction": _text(data, "correction"),
        "customer_ref": _text(data, "customer_ref", 200),
    }
    if rating is None and not fields["comment"] and not fields["correction"]:
        raise FieldError("rating", "give at least one of rating, comment, correction")
    idempotency_key = _text(data, "idempotency_key", 200)
    if target is None:
        target = feedback_target_find(
            deployment=deployment,
            trace_id=data.get("trace_id"),
            external_id=data.get("external_id"),
            response_id=data.get("response_id"),
        )
    request_hash = _request_hash(target, fields)
    if idempotency_key:
        existing = CustomerFeedback.objects.filter(deployment=deployment, idempotency_key=idempotency_key).first()
        if existing is not None:
            if existing.request_hash != request_hash:
                raise IdempotencyConflict("this idempotency_key was used for a different request")
            return existing, False
    if link_id and CustomerFeedback.objects.filter(link_id=link_id).exists():
        raise FeedbackLinkUsed()
    try:
        return _store(deployment, target, fields, idempotency_key, request_hash, api_key, source, link_id, now), True
    except IntegrityError:
        if link_id and CustomerFeedback.objects.filter(link_id=link_id).exists():
            raise FeedbackLinkUsed() from None  # a concurrent answer through the same link won
        # A concurrent retry with the same key won the race.
        existing = CustomerFeedback.objects.get(deployment=deployment, idempotency_key=idempotency_key)
        if existing.request_hash != request_hash:
            raise IdempotencyConflict("this idempotency_key was used for a different request") from None
        return existing, False


@transaction.atomic
def _store(
    deployment, target, fields, idempotency_key, request_hash, api_key, source, link_id, now
) -> CustomerFeedback:
    feedback = CustomerFeedback.objects.create(
        deployment=deployment,
        trace=target.trace,
        message=target.message,
        api_key=api_key,
        source=source,
        link_id=link_id,
        idempotency_key=idempotency_key,
        request_hash=request_hash,
        created_at=now or timezone.now(),
        **fields,
    )
    updates: dict[str, Any] = {"has_customer_feedback": True}
    if fields["rating"] is not None:
        sentiment = rating_sentiment(fields["rating_kind"], fields["rating"])
        updates["feedback_rating"] = Least(Coalesce(F("feedback_rating"), Value(sentiment)), Value(sentiment))
    Trace.objects.filter(pk=target.trace.pk).update(**updates)
    judge_on_customer_feedback(feedback=feedback)
    return feedback


def feedback_link_create(
    *,
    target: FeedbackTarget,
    customer_ref: str = "",
    expires_in: timedelta | None = None,
    now: datetime | None = None,
) -> tuple[str, datetime]:
    """A signed token for a link that lets a browser post feedback on one trace without a key."""
    max_age = timedelta(seconds=settings.FEEDBACK_LINK_MAX_AGE)
    expires_in = expires_in or timedelta(seconds=settings.FEEDBACK_LINK_DEFAULT_AGE)
    if expires_in <= timedelta(0) or expires_in > max_age:
        raise FieldError("expires_in", f"seconds from 1 to {int(max_age.total_seconds())}")
    expires_at = (now or timezone.now()) + expires_in
    payload = {
        "n": secrets.token_urlsafe(12),  # the link's own id: each link is single-use
        "t": target.trace.pk,
        "m": target.message.pk if target.message else None,
        "c": customer_ref[:200],
        "e": int(expires_at.timestamp()),
    }
    return signing.dumps(payload, salt=LINK_SALT, compress=True), expires_at


def feedback_link_resolve(*, token: str, now: datetime | None = None) -> ResolvedLink:
    """The target, customer_ref and single-use id of a link (and whether it was used), or
    `FeedbackLinkError`."""
    try:
        payload = signing.loads(token, salt=LINK_SALT, max_age=settings.FEEDBACK_LINK_MAX_AGE)
    except signing.SignatureExpired as exc:
        raise FeedbackLinkError("this feedback link has expired") from exc
    except signing.BadSignature as exc:
        raise FeedbackLinkError("this feedback link is not valid") from exc
    now = now or timezone.now()
    if not isinstance(payload, dict) or "t" not in payload or "e" not in payload:
        raise FeedbackLinkError("this feedback link is not valid")
    if payload["e"] <= now.timestamp():
        raise FeedbackLinkError("this feedback link has expired")
    trace = Trace.objects.select_related("deployment").filter(pk=payload["t"]).first()
    if trace is None:
        raise FeedbackLinkError("the conversation of this feedback link no longer exists")
    message = Message.objects.filter(pk=payload["m"], trace=trace).first() if payload.get("m") else None
    # Links made before links had ids are told apart by their token (unique per link).
    link_id = str(payload.get("n") or hashlib.sha256(token.encode()).hexdigest())[:64]
    return ResolvedLink(
        target=FeedbackTarget(trace, message),
        customer_ref=payload.get("c", ""),
        link_id=link_id,
        used=CustomerFeedback.objects.filter(link_id=link_id).exists(),
    )
