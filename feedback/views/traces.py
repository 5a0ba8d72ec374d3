"""Dashboard pages (server-rendered, htmx)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from feedback.models import Trace

PAGE_SIZE = 50


@login_required
def trace_list(request: HttpRequest) -> HttpResponse:
    traces = Trace.objects.select_related("deployment").order_by("-started_at", "-id")[:PAGE_SIZE]
    return render(request, "feedback/trace_list.html", {"traces": traces})
