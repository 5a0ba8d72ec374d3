"""Trace list and trace detail pages."""

from __future__ import annotations

from datetime import datetime
from urllib.parse import parse_qsl

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django_htmx.http import push_url, replace_url

from feedback.forms import TraceFilterForm
from feedback.models import Message, Trace
from feedback.permissions import BROWSE, BUILD_QUEUE, can_annotate, can_see_trace
from feedback.selectors.judge import judge_results_for_messages
from feedback.selectors.review import json_pretty, trace_by_id, trace_review
from feedback.selectors.trace_list import (
    PAGE_SIZE,
    Cursor,
    demo_agent_starting,
    flag_names,
    trace_neighbour,
    trace_page,
)
from feedback.selectors.traces import message_as_openai
from feedback.services.review import REVIEW_LIMITS
from feedback.templatetags.judge_tags import reward_class
from feedback.views.common import filter_query
from webapp.kernel.csp import with_csp
from webapp.kernel.pages import dashboard_view


@dashboard_view(BROWSE)
def trace_list(request: HttpRequest) -> HttpResponse:
    return trace_list_page(request, request.GET)


# The queue form's fields as the page first shows them.
QUEUE_DEFAULTS = {"name": "", "limit": "100", "lock_minutes": "10", "instructions": "", "rubric": "", "dimensions": ""}


def trace_list_page(
    request: HttpRequest, params: QueryDict, *, queue_values: dict | None = None, queue_problems=None
) -> HttpResponse:
    """The list under the filter in `params`. With `queue_problems` (a queue that could not be
    built from it) the queue form is open again with what was typed and why it was refused."""
    form = TraceFilterForm(params if any(params.values()) else None)
    filters = form.filters()
    after = Cursor.decode(params.get("after"))
    # `shown`: how many rows the list showed ("Load more" adds a page). The address bar keeps
    # it, so back/forward and a reload show the rows that were loaded, at the same scroll.
    shown = _shown(params.get("shown"))
    if after is None:
        page = trace_page(filters=filters, limit=shown)
        total = len(page.rows)
    else:
        page = trace_page(filters=filters, after=after)
        total = shown + len(page.rows)
    query = filter_query(params)
    # Row links and labels are built here, not with {% url %}/filters per row: the list
    # renders 50 rows per request and template tags are the slowest part of it.
    suffix = f"/?{query}" if query else "/"
    prefix = reverse("feedback:trace-list")
    for row in page.rows:
        row["href"] = f"{prefix}{row['id']}{suffix}"
        row["started"] = row["started_at"].strftime("%Y-%m-%d %H:%M:%S")
        row["model"] = row["model_version__name"] or row["model_name"]
        row["reward_class"] = reward_class(row.get("judge_reward"))
        preview = row["preview"]
        row["preview"] = preview if len(preview) <= 140 else preview[:139] + "…"
        row["label"] = row["external_id"] if len(row["external_id"]) <= 40 else row["external_id"][:39] + "…"
        row["score"] = "" if row["outcome_score"] is None else f"{row['outcome_score']:.2f}"
        row["latency"] = _duration(row["started_at"], row["ended_at"])
        row["tokens"] = f"{row['total_tokens']:,}" if row["total_tokens"] else "—"
    context = {
        "form": form,
        "page": page,
        "query": query,
        # From the list's own address: the page may be answering a POST elsewhere (a refused queue).
        "next_url": f"{prefix}?{query}&after={page.next_cursor.encode()}&shown={total}" if page.next_cursor else None,
        "can_build_queue": request.user.has_perm(BUILD_QUEUE),
        "filter_pairs": parse_qsl(query),
        # Asked only of an empty first page: under `make demo`, nothing yet means its agent is starting.
        "demo_starting": not page.rows and after is None and demo_agent_starting(),
        "queue": {**QUEUE_DEFAULTS, **(queue_values or {})},
        "queue_problems": queue_problems,
    }
    htmx = request.htmx
    if htmx and not htmx.history_restore_request and queue_problems is None:
        if after is not None:
            listed = f"{prefix}?{query}&shown={total}" if query else f"{prefix}?shown={total}"
            return replace_url(render(request, "feedback/trace_list.html#rows", context), listed)
        # The address bar shows the filter without the form's empty fields.
        return push_url(
            render(request, "feedback/trace_list.html#results", context), f"{prefix}?{query}" if query else prefix
        )
    context["flag_names"] = flag_names()
    context["selects"] = form.selects()
    return render(request, "feedback/trace_list.html", context, status=400 if queue_problems else 200)


MAX_SHOWN = 1_000


def _duration(started: datetime, ended: datetime | None) -> str:
    """A trace's latency, from its start to its end, as people read it: 850 ms, 4.2 s, 3 min."""
    if ended is None or ended < started:
        return "—"
    seconds = (ended - started).total_seconds()
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _shown(value: str | None) -> int:
    """The `shown` parameter: rows to show at once, from one page to MAX_SHOWN."""
    try:
        n = int(value or PAGE_SIZE)
    except ValueError:
        return PAGE_SIZE
    return max(PAGE_SIZE, min(n, MAX_SHOWN))


def trace_or_404(request: HttpRequest, trace_id: int) -> Trace:
    trace = trace_by_id(trace_id)
    if trace is None:
        raise Http404("no such trace")
    if not can_see_trace(request.user, trace):
        raise PermissionDenied("your role sees traces only through annotation queues")
    return trace


def trace_detail_context(request: HttpRequest, trace: Trace, **extra) -> dict:
    query = filter_query(request.GET)
    try:
        page = int(request.GET.get("page") or 1)
    except ValueError:
        page = 1
    review = trace_review(trace=trace, user=request.user, page=page)
    return {
        "review": review,
        "judgements": judge_results_for_messages(message_ids=[t.message.id for t in review.turns if t.is_assistant]),
        "can_judge": request.user.has_perm("feedback.add_judgejob"),
        "trace": trace,
        "query": query,
        "can_annotate": can_annotate(request.user),
        "here": request.get_full_path(),
        "limits": REVIEW_LIMITS,
        **extra,
    }


@dashboard_view()
def trace_detail(request: HttpRequest, trace_id: int) -> HttpResponse:
    trace = trace_or_404(request, trace_id)
    return render(request, "feedback/trace_detail.html", trace_detail_context(request, trace))


@dashboard_view()
def trace_side(request: HttpRequest, trace_id: int) -> HttpResponse:
    """The trace page's side panel alone: the page asks for it again after a comment, a
    rating, a correction or a judgement changed what it summarises."""
    trace = trace_or_404(request, trace_id)
    return render(request, "feedback/_trace_side.html", trace_detail_context(request, trace))


@dashboard_view(BROWSE)
def trace_neighbour_view(request: HttpRequest, trace_id: int, direction: str) -> HttpResponse:
    """j/k: the next older / newer trace in the current filter, or back to the list at the end."""
    trace = get_object_or_404(Trace.objects.only("id", "started_at"), pk=trace_id)
    form = TraceFilterForm(request.GET if any(request.GET.values()) else None)
    neighbour = trace_neighbour(filters=form.filters(), trace=trace, older=direction == "next")
    query = filter_query(request.GET)
    suffix = f"?{query}" if query else ""
    if neighbour is None:
        return redirect(reverse("feedback:trace-list") + suffix)
    return redirect(reverse("feedback:trace-detail", args=[neighbour]) + suffix)


def _message(request: HttpRequest, trace_id: int, position: int) -> Message:
    trace = trace_or_404(request, trace_id)
    message = Message.objects.filter(trace=trace, position=position).first()
    if message is None:
        raise Http404("no such message")
    return message


@dashboard_view()
def message_content(request: HttpRequest, trace_id: int, position: int) -> HttpResponse:
    """The whole text of a message: an escaped fragment for htmx, plain text otherwise."""
    message = _message(request, trace_id, position)
    if request.htmx:
        return render(request, "feedback/_message_text.html", {"text": message.content, "pos": position})
    return HttpResponse(message.content, content_type="text/plain; charset=utf-8")


@dashboard_view()
def message_raw(request: HttpRequest, trace_id: int, position: int) -> HttpResponse:
    """The message as stored (its submitted JSON), pretty-printed."""
    message = _message(request, trace_id, position)
    text = json_pretty(message.raw or message_as_openai(message))
    if request.htmx:
        return render(request, "feedback/_message_text.html", {"text": text, "raw": True})
    return with_csp(HttpResponse(text, content_type="application/json"))
