"""Refuse a NUL character at the door of the pages and the APIs.

PostgreSQL text cannot hold NUL, so a value carrying one fails wherever it is written or
looked up: a `?deployment=a%00b`, a rollback reason or a URL segment was a 500. Services that
store text keep their own checks (they are called from commands and workers too); this
guard answers every query parameter, form field and URL path of a request with the one
400 the rest of the site gives, naming the field, before any view runs. JSON bodies are
left to the APIs' serializers, and trace content to ingestion, which replaces NUL in what it
stores on purpose (a model's output may contain one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.utils.html import escape

from webapp.kernel.errors import Invalid

FORM = "application/x-www-form-urlencoded"


def _first_with_nul(params: QueryDict) -> str | None:
    for key, values in params.lists():
        if "\x00" in key or any("\x00" in v for v in values):
            return key.replace("\x00", "\ufffd")
    return None


def _offending(request: HttpRequest) -> str | None:
    if "\x00" in request.path_info:
        return "path"
    found = _first_with_nul(request.GET)
    # A page's form is read here as the CSRF check reads it anyway; an API's multipart body
    # is left to the view, which parses uploads with its own limits.
    form = not request.path_info.startswith("/api/") or request.content_type == FORM
    if found is None and request.method == "POST" and form:
        found = _first_with_nul(request.POST)
    return found


class NulRefusalMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        field = _offending(request)
        if field is None:
            return self.get_response(request)
        reason = "contains a NUL character"
        if request.path_info.startswith("/api/"):
            return JsonResponse(Invalid(reason, field=field).as_body(), status=400)
        return HttpResponse(
            f"<!doctype html><title>Bad request</title><p>{escape(field)}: {reason}</p>",
            status=400,
            content_type="text/html; charset=utf-8",
        )


def strip_nul(value: Any) -> Any:
    """`value` with U+0000 replaced by U+FFFD in every string: PostgreSQL's text and jsonb
    cannot hold NUL, and untrusted trace content (or a model's output) may contain it."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [strip_nul(v) for v in value]
    if isinstance(value, dict):
        return {strip_nul(k): strip_nul(v) for k, v in value.items()}
    return value
