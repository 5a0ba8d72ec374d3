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

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.html import escape

FORM = "application/x-www-form-urlencoded"


def _offending(request: HttpRequest) -> str | None:
    if "\x00" in request.path_info:
        return "path"
    for key, values in request.GET.lists():
        if "\x00" in key or any("\x00" in v for v in values):
            return key.replace("\x00", "\ufffd")
    # A page's form is read here as the CSRF check reads it anyway; an API's multipart body
    # is left to the view, which parses uploads with its own limits.
    if request.method == "POST" and (not request.path_info.startswith("/api/") or request.content_type == FORM):
        for key, values in request.POST.lists():
            if "\x00" in key or any("\x00" in v for v in values):
                return key.replace("\x00", "\ufffd")
    return None


class NulRefusalMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        field = _offending(request)
        if field is None:
            return self.get_response(request)
        reason = "contains a NUL character"
        if request.path_info.startswith("/api/"):
            return JsonResponse(
                {"detail": f"{field}: {reason}", "errors": [{"field": field, "reason": reason}]}, status=400
            )
        return HttpResponse(
            f"<!doctype html><title>Bad request</title><p>{escape(field)}: {reason}</p>",
            status=400,
            content_type="text/html; charset=utf-8",
        )
