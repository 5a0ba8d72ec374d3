"""Annotation queues: build one from the current list filter, work through it."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from feedback.forms import FILTER_FIELDS, QueueCreateForm, trace_filters
from feedback.models import AnnotationQueue, QueueItem, QueueItemStatus
from feedback.permissions import BUILD_QUEUE, WORK_QUEUE, can_browse
from feedback.selectors.queues import (
    queue_item_brief,
    queue_item_neighbours,
    queue_items,
    queue_progress,
    queue_score_summary,
    queues_with_progress,
)
from feedback.selectors.trace_list import traces_filtered
from feedback.services.queue_scores import dimensions_text, queue_item_scores_save, queue_rubric_set
from feedback.services.queues import QueueItemNotHeld, queue_create, queue_item_done, queue_item_skip, queue_next_item
from feedback.views.traces import QUEUE_DEFAULTS, trace_detail_context, trace_list_page, trace_or_404
from webapp.kernel.chat_format import FieldError
from webapp.kernel.form_problems import django_form_problems, problems
from webapp.kernel.pages import dashboard_view


@dashboard_view("feedback.view_annotationqueue")
def queue_list(request: HttpRequest) -> HttpResponse:
    return render(request, "feedback/queue_list.html", {"queues": queues_with_progress()})


@require_POST
@dashboard_view(BUILD_QUEUE)
def queue_create_view(request: HttpRequest) -> HttpResponse:
    """Build a queue from the trace-list filter posted with it (the same parameter names)."""
    form = QueueCreateForm(request.POST)
    # The filter as the list shows it: only its fields, none of the form's own.
    shown = QueryDict(mutable=True)
    for key in FILTER_FIELDS:
        shown.setlist(key, request.POST.getlist(key))
    try:
        # A filter value that cannot be read is refused, never widened to "any".
        filters = trace_filters({k: v for k in FILTER_FIELDS if (v := request.POST.get(k, ""))})
    except FieldError as exc:
        refused = problems([("", f"the list's filter {exc.field}: {exc.reason}")], labels={}, prefix="queue")
    else:
        refused = None
    if refused is None and form.is_valid():
        try:
            queue = queue_create(
                name=form.cleaned_data["name"],
                description=form.cleaned_data["description"],
                traces=traces_filtered(filters),
                filters={k: request.POST.getlist(k) for k in FILTER_FIELDS if any(request.POST.getlist(k))},
                created_by=request.user,
                limit=form.cleaned_data["limit"],
                lock_minutes=form.cleaned_data["lock_minutes"],
                instructions=form.cleaned_data["instructions"],
                rubric=form.cleaned_data["rubric"],
                dimensions=form.cleaned_data["dimensions"],
            )
        except FieldError as exc:
            refused = problems([(exc.field, exc.reason)], labels=_QUEUE_LABELS, prefix="queue")
        else:
            messages.success(request, f"Queue “{queue.name}” holds {queue.item_count} traces.")
            return redirect("feedback:queue-detail", queue_id=queue.pk)
    elif refused is None:
        refused = django_form_problems(form, prefix="queue")
    if not can_browse(request.user):
        # The page that keeps what was typed shows the trace list, which this account may not read.
        raise PermissionDenied(f"{refused.text()} (and this account may not read the trace list)")
    # The list under the same filter, the form open with what was typed and each reason beside
    # its field: a refused queue loses nothing.
    typed = {key: request.POST.get(key, "") for key in QUEUE_DEFAULTS}
    return trace_list_page(request, shown, queue_values=typed, queue_problems=refused)


_QUEUE_LABELS = {name: str(field.label or name.capitalize()) for name, field in QueueCreateForm.base_fields.items()}


@dashboard_view("feedback.view_annotationqueue")
def queue_detail(request: HttpRequest, queue_id: int) -> HttpResponse:
    queue = get_object_or_404(AnnotationQueue.objects.select_related("created_by", "failure_cluster"), pk=queue_id)
    return _queue_page(request, queue)


def _queue_page(request: HttpRequest, queue: AnnotationQueue, *, error=None, draft=None) -> HttpResponse:
    done, reviewers = queue_progress(queue)
    context = {
        "queue": queue,
        "done": done,
        "reviewers": reviewers,
        "items": queue_items(queue, user=request.user, can_browse=can_browse(request.user)),
        "can_work": request.user.has_perm(WORK_QUEUE),
        "can_edit": request.user.has_perm(BUILD_QUEUE),
        "summary": queue_score_summary(queue),
        "rubric_form": draft
        or {"instructions": queue.instructions, "rubric": queue.rubric, "dimensions": dimensions_text(queue)},
        "error": error,
    }
    return render(request, "feedback/queue_detail.html", context, status=400 if error else 200)


@require_POST
@dashboard_view(BUILD_QUEUE)
def queue_rubric_edit(request: HttpRequest, queue_id: int) -> HttpResponse:
    """Set the queue's instructions, rubric and score dimensions; a refused edit comes back
    with what was typed and the error beside its field."""
    queue = get_object_or_404(AnnotationQueue.objects.select_related("created_by", "failure_cluster"), pk=queue_id)
    draft = {k: request.POST.get(k, "") for k in ("instructions", "rubric", "dimensions")}
    try:
        queue_rubric_set(queue=queue, **draft)
    except FieldError as exc:
        return _queue_page(request, queue, error=exc, draft=draft)
    messages.success(
        request, "Saved: reviewers see these instructions, this rubric and these dimensions on every item."
    )
    return redirect("feedback:queue-detail", queue_id=queue.pk)


@require_POST
@dashboard_view(WORK_QUEUE)
def queue_next(request: HttpRequest, queue_id: int) -> HttpResponse:
    queue = get_object_or_404(AnnotationQueue, pk=queue_id)
    item = queue_next_item(queue=queue, user=request.user)
    if item is None:
        messages.info(request, "Nothing left for you in this queue.")
        return redirect("feedback:queue-detail", queue_id=queue.pk)
    return redirect("feedback:queue-item", queue_id=queue.pk, item_id=item.pk)


def _item(request: HttpRequest, queue_id: int, item_id: int) -> QueueItem:
    return get_object_or_404(
        QueueItem.objects.select_related("queue", "trace__deployment", "trace__model_version", "locked_by"),
        pk=item_id,
        queue_id=queue_id,
    )


@dashboard_view(WORK_QUEUE)
def queue_item(request: HttpRequest, queue_id: int, item_id: int) -> HttpResponse:
    """The trace of a queue item, with Done and Skip; visible while the reviewer holds it."""
    item = _item(request, queue_id, item_id)
    trace = trace_or_404(request, item.trace_id)
    previous, following = queue_item_neighbours(item, user=request.user)
    context = trace_detail_context(
        request,
        trace,
        queue_item=item,
        queue=item.queue,
        previous_item=previous,
        next_item=following,
        holds_item=item.status == QueueItemStatus.PENDING and item.locked_by_id == request.user.pk,
        brief=queue_item_brief(item=item, user=request.user),
        can_score=_can_score(item, request.user),
    )
    return render(request, "feedback/trace_detail.html", context)


def _can_score(item: QueueItem, user) -> bool:
    pending = item.status == QueueItemStatus.PENDING
    return (pending and item.locked_by_id == user.pk) or (not pending and item.done_by_id == user.pk)


@require_POST
@dashboard_view(WORK_QUEUE)
def queue_item_scores(request: HttpRequest, queue_id: int, item_id: int) -> HttpResponse:
    """Save the reviewer's scores of an item, one per dimension (inputs `score-<name>`); for
    htmx the brief comes back in place, with the error beside its dimension when refused."""
    item = _item(request, queue_id, item_id)
    trace_or_404(request, item.trace_id)
    prefix = "score-"
    values = {k[len(prefix) :]: v for k, v in request.POST.items() if k.startswith(prefix)}
    error = None  # {"dimension": the name it is about, or "", "text": what to fix}
    try:
        queue_item_scores_save(item=item, user=request.user, values=values)
    except FieldError as exc:
        name = exc.field.removeprefix("scores.")
        error = {"dimension": name, "text": f"{name}: {exc.reason}"}
    except QueueItemNotHeld as exc:
        error = {"dimension": "", "text": str(exc)}
    if not request.htmx:
        if error is not None:
            messages.error(request, error["text"])
        else:
            messages.success(request, "Scores saved.")
        return redirect("feedback:queue-item", queue_id=queue_id, item_id=item_id)
    brief = queue_item_brief(item=item, user=request.user)
    if error is not None:  # what was chosen stays chosen
        for f in brief.fields:
            f.answer = values.get(f.dimension.name, f.answer)
    context = {
        "queue": item.queue,
        "queue_item": item,
        "trace": item.trace,
        "brief": brief,
        "can_score": _can_score(item, request.user),
        "score_error": error,
        "scores_saved": error is None,
    }
    return render(request, "feedback/_queue_brief.html", context, status=400 if error else 200)


@require_POST
@dashboard_view(WORK_QUEUE)
def queue_item_action(request: HttpRequest, queue_id: int, item_id: int, action: str) -> HttpResponse:
    item = _item(request, queue_id, item_id)
    try:
        if action == "done":
            queue_item_done(item=item, user=request.user)
        else:
            queue_item_skip(item=item, user=request.user)
    except QueueItemNotHeld as exc:
        messages.error(request, str(exc))
        return redirect("feedback:queue-detail", queue_id=queue_id)
    nxt = queue_next_item(queue=item.queue, user=request.user)
    if nxt is None:
        messages.success(request, "Queue finished: nothing left for you.")
        return redirect("feedback:queue-detail", queue_id=queue_id)
    return redirect("feedback:queue-item", queue_id=queue_id, item_id=nxt.pk)
