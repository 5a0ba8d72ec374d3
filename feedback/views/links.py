"""The public page behind a feedback link: a customer rates and comments on one
conversation without an account or key. The signed token is the credential."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from feedback.models import FeedbackSource
from feedback.services.customer_feedback import (
    MAX_TEXT_CHARS,
    FeedbackLinkError,
    FeedbackLinkUsed,
    customer_feedback_create,
    feedback_link_resolve,
)
from webapp.kernel.chat_format import FieldError
from webapp.kernel.csp import with_csp

_FIELD_NAMES = {"comment": "Your comment", "correction": "Your suggested answer"}


def customer_error(error: FieldError) -> tuple[str, str]:
    """The field an error belongs to on the public form, and what to tell the customer, in
    their words rather than the API's."""
    if error.field in _FIELD_NAMES:
        name = _FIELD_NAMES[error.field]
        if "at most" in error.reason:
            length = error.reason.split(" ", 1)[0]
            return error.field, f"{name} is {length} characters long; please shorten it to {MAX_TEXT_CHARS:,} or fewer."
        return error.field, f"{name} contains a character we cannot store; please remove it and send again."
    if error.field == "rating" and "at least one" in error.reason:
        return "rating", "Please choose Helpful or Not helpful, or write a comment, before sending."
    return "rating", "Please choose Helpful or Not helpful."


@require_http_methods(["GET", "POST"])
def feedback_link_page(request: HttpRequest, token: str) -> HttpResponse:
    try:
        link = feedback_link_resolve(token=token)
    except FeedbackLinkError as exc:
        return with_csp(render(request, "feedback/feedback_link.html", {"refused": str(exc)}, status=403))
    if link.used:
        return _used(request)
    target = link.target
    context = {"target": target, "sent": False, "posted": {}, "limit": MAX_TEXT_CHARS}
    if request.method == "POST":
        data = {k: request.POST.get(k) or None for k in ("rating", "comment", "correction")}
        data["customer_ref"] = link.customer_ref
        try:
            customer_feedback_create(
                deployment=target.trace.deployment,
                data=data,
                target=target,
                source=FeedbackSource.LINK,
                link_id=link.link_id,
            )
        except FeedbackLinkUsed:
            return _used(request)
        except FieldError as exc:
            # What the customer typed stays in the form, with the error beside its field.
            context["error_field"], context["error_message"] = customer_error(exc)
            context["posted"] = data
            return with_csp(render(request, "feedback/feedback_link.html", context, status=400))
        context["sent"] = True
    return with_csp(render(request, "feedback/feedback_link.html", context))


def _used(request: HttpRequest) -> HttpResponse:
    context = {"refused": str(FeedbackLinkUsed()), "used": True}
    return with_csp(render(request, "feedback/feedback_link.html", context, status=409))
