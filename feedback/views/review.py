"""Annotating a trace: comments, turn ratings and corrections.

Each form posts to a URL of its own. An htmx request gets the turn's updated fragment
back; a plain form post is redirected to the page it came from (`next`).
"""

from __future__ import annotations

import re

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST
from django_htmx.http import reswap, retarget, trigger_client_event

from feedback.forms import CommentForm
from feedback.models import Comment, Correction, Message, RatingKind
from feedback.permissions import ANNOTATE, can_see_trace
from feedback.selectors.review import pretty_json, tool_names, trace_by_id, turn_single
from feedback.services.review import (
    REVIEW_LIMITS,
    comment_add,
    comment_delete,
    comment_edit,
    comment_resolve,
    correction_add,
    correction_delete,
    turn_rating_clear,
    turn_rating_set,
)
from webapp.kernel.chat_format import FieldError
from webapp.kernel.pages import dashboard_view, safe_next


def _message(request: HttpRequest, trace_id: int, position: int) -> Message:
    trace = trace_by_id(trace_id)
    if trace is None:
        raise Http404("no such trace")
    if not can_see_trace(request.user, trace):
        raise PermissionDenied("you cannot see this trace")
    message = Message.objects.filter(trace=trace, position=position).first()
    if message is None:
        raise Http404("no such message")
    message.trace = trace
    return message


def _turn_response(request: HttpRequest, message: Message, fragment: str, status: int = 200, **extra) -> HttpResponse:
    if request.htmx:
        turn = turn_single(trace=message.trace, position=message.position, user=request.user)
        context = {
            "turn": turn,
            "trace": message.trace,
            "can_annotate": True,
            "here": safe_next(request, ""),
            "limits": REVIEW_LIMITS,
            **extra,
        }
        response = render(request, f"feedback/trace_detail.html#{fragment}", context, status=status)
        # The side panel summarises the turns' feedback: it reloads itself on this event.
        return trigger_client_event(response, "trace-changed") if status < 400 else response
    if status >= 400:
        return render(request, "feedback/form_error.html", {"error": extra.get("error")}, status=status)
    default = reverse("feedback:trace-detail", args=[message.trace_id]) + f"#msg-{message.position}"
    return redirect(safe_next(request, default))


@require_POST
@dashboard_view(ANNOTATE)
def comment_create_view(request: HttpRequest, trace_id: int, position: int) -> HttpResponse:
    message = _message(request, trace_id, position)
    form = CommentForm(request.POST)
    draft = {k: request.POST.get(k, "") for k in ("body", "quote", "quote_start", "quote_end")}
    if not form.is_valid():
        error = FieldError(*next(iter((k, str(v[0])) for k, v in form.errors.items())))
        return _turn_response(request, message, "comments", status=400, error=error, draft=draft)
    try:
        comment_add(
            message=message,
            author=request.user,
            body=form.cleaned_data["body"],
            quote=form.cleaned_data["quote"] or "",
            quote_start=form.cleaned_data["quote_start"],
            quote_end=form.cleaned_data["quote_end"],
        )
    except FieldError as exc:
        return _turn_response(request, message, "comments", status=400, error=exc, draft=draft)
    return _turn_response(request, message, "comments")


def _comment(request: HttpRequest, comment_id: int) -> tuple[Comment, Message]:
    comment = get_object_or_404(Comment.objects.select_related("message"), pk=comment_id)
    return comment, _message(request, comment.trace_id, comment.message.position)


@require_POST
@dashboard_view(ANNOTATE)
def comment_edit_view(request: HttpRequest, comment_id: int) -> HttpResponse:
    comment, message = _comment(request, comment_id)
    try:
        comment_edit(comment=comment, user=request.user, body=request.POST.get("body", ""))
    except FieldError as exc:
        return _turn_response(request, message, "comments", status=400, error=exc)
    return _turn_response(request, message, "comments")


@require_POST
@dashboard_view(ANNOTATE)
def comment_delete_view(request: HttpRequest, comment_id: int) -> HttpResponse:
    comment, message = _comment(request, comment_id)
    comment_delete(comment=comment, user=request.user)
    return _turn_response(request, message, "comments")


@require_POST
@dashboard_view(ANNOTATE)
def comment_resolve_view(request: HttpRequest, comment_id: int) -> HttpResponse:
    comment, message = _comment(request, comment_id)
    comment_resolve(comment=comment, user=request.user, resolved=request.POST.get("resolved", "1") == "1")
    return _turn_response(request, message, "comments")


@require_POST
@dashboard_view("feedback.add_turnrating")
def rating_view(request: HttpRequest, trace_id: int, position: int) -> HttpResponse:
    message = _message(request, trace_id, position)
    # One field: "up"/"down" (thumbs), "1"-"5" (score) or "clear".
    value = request.POST.get("rating", "")
    try:
        if value == "clear":
            turn_rating_clear(message=message, user=request.user)
        else:
            kind = RatingKind.THUMBS if value in ("up", "down") else RatingKind.SCORE
            turn_rating_set(message=message, user=request.user, kind=kind, value=value)
    except FieldError as exc:
        return _turn_response(request, message, "rating", status=400, error=exc)
    return _turn_response(request, message, "rating")


_ROW = re.compile(r"^tool_calls\[(\d+)\]")


def _posted_tool_calls(request: HttpRequest) -> list[dict]:
    ids, names, args = (request.POST.getlist(k) for k in ("tool_id", "tool_name", "tool_args"))
    calls = []
    for i, name in enumerate(names):
        arguments = args[i] if i < len(args) else ""
        if not name.strip() and not arguments.strip():
            continue  # an empty row the person added and left
        call = {"function": {"name": name.strip(), "arguments": arguments}}
        if i < len(ids) and ids[i]:
            call["id"] = ids[i]
        calls.append(call)
    return calls


@require_http_methods(["GET", "POST"])
@dashboard_view("feedback.add_correction")
def correction_editor(request: HttpRequest, trace_id: int, position: int) -> HttpResponse:
    """Write the response an assistant turn should have been: text and tool calls, checked
    against the trace's tool definitions; the original stays as it was. From the trace page
    (htmx) the editor opens inline under the turn and, once saved, the turn's corrections
    replace it; without scripts it is a page of its own."""
    message = _message(request, trace_id, position)
    if message.role != "assistant":
        raise Http404("only assistant turns can be corrected")
    inline = bool(request.htmx)
    back = safe_next(request, reverse("feedback:trace-detail", args=[trace_id]) + f"#msg-{position}")
    error, error_row = None, None
    if request.method == "POST":
        calls = _posted_tool_calls(request)
        try:
            correction_add(
                message=message,
                author=request.user,
                content=request.POST.get("content", ""),
                tool_calls=calls,
                note=request.POST.get("note", ""),
            )
        except FieldError as exc:
            error = exc
            match = _ROW.match(exc.field)
            error_row = int(match.group(1)) if match else None
        else:
            if inline:
                response = _turn_response(request, message, "corrections")
                return reswap(retarget(response, f"#corrections-{position}"), "outerHTML")
            return redirect(back)
        # What was typed comes back as it was typed, with the error beside its field.
        content, note = request.POST.get("content", ""), request.POST.get("note", "")
        rows = [
            {"id": c.get("id", ""), "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in calls
        ]
    else:
        content, note = message.content, ""
        rows = [
            {"id": c["id"], "name": c["function"]["name"], "arguments": pretty_json(c["function"]["arguments"])}
            for c in message.tool_calls or []
        ]
    for i, row in enumerate(rows):
        row["error"] = error if error_row == i else None
    context = {
        "trace": message.trace,
        "message": message,
        "content": content,
        "note": note,
        "rows": rows,
        "tool_names": tool_names(message.trace),
        "tools": message.trace.tools,
        "error": error,
        "error_placed": error is not None and (error_row is not None or error.field in ("content", "note")),
        "back": back,
        "inline": inline,
        "limits": REVIEW_LIMITS,
    }
    template = "feedback/correction_edit.html#editor" if inline else "feedback/correction_edit.html"
    return render(request, template, context, status=400 if error else 200)


@require_POST
@dashboard_view("feedback.add_correction")
def correction_delete_view(request: HttpRequest, correction_id: int) -> HttpResponse:
    correction = get_object_or_404(Correction.objects.select_related("message"), pk=correction_id)
    message = _message(request, correction.trace_id, correction.message.position)
    correction_delete(correction=correction, user=request.user)
    return _turn_response(request, message, "corrections")
