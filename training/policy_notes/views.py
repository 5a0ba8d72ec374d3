"""Policy note pages (htmx): the notes of each deployment with a form asking the judge for
one, and a note's page, where an operator edits it (a new version) and an approver
approves its latest version. Comment text is operators' words about untrusted traces:
the templates escape it (no `|safe` anywhere on these pages)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from training.environments.policy_rules import RuleError, rule_from_text
from training.policy_notes.selectors import policy_note_get, policy_notes, rule_text
from training.policy_notes.services import (
    APPROVE,
    MAX_COMMENTS,
    PROPOSE,
    PolicyNoteError,
    policy_note_approve,
    policy_note_edit,
    policy_note_propose,
)
from training.serving.models import Deployment
from webapp.kernel.ids import parse_id
from webapp.kernel.pages import dashboard_view

VIEW = "feedback.view_trace"


@dashboard_view(VIEW)
def policy_note_list(request: HttpRequest) -> HttpResponse:
    errors: list[tuple[str, str]] = []
    if request.method == "POST":
        if not request.user.has_perm(PROPOSE):
            raise PermissionDenied(f"asking the judge for a note needs {PROPOSE} (the operator role)")
        deployment = Deployment.objects.filter(pk=parse_id(request.POST.get("deployment"))).first()
        limit = parse_id(request.POST.get("limit")) or MAX_COMMENTS
        if deployment is None:
            errors.append(("deployment", "choose a deployment"))
        else:
            try:
                note = policy_note_propose(deployment=deployment, requested_by=request.user, limit=limit)
            except PolicyNoteError as exc:
                errors += exc.errors
            else:
                return redirect("training:policy-note", note.pk)
    notes = list(policy_notes()[:100])
    return render(
        request,
        "training/policy_note_list.html",
        {
            "notes": [(n, list(n.versions.all())) for n in notes],
            "deployments": Deployment.objects.order_by("name"),
            "errors": errors,
            "max_comments": MAX_COMMENTS,
            "can_propose": request.user.has_perm(PROPOSE),
        },
        status=400 if errors else 200,
    )


def _note_context(request: HttpRequest, note_id: int, **extra: Any) -> dict[str, Any]:
    note = policy_note_get(note_id=note_id)
    if note is None:
        raise Http404("no policy note of that id")
    versions = list(note.versions.all())
    latest = versions[0]
    return {
        "note": note,
        "latest": latest,
        "latest_rule": rule_text(latest.rule),
        "versions": [(v, rule_text(v.rule)) for v in versions],
        "approved": next((v for v in versions if v.pk == note.approved_version_id), None),
        "can_edit": request.user.has_perm(PROPOSE),
        "can_approve": request.user.has_perm(APPROVE) and note.approved_version_id != latest.pk,
        "form": {"text": latest.text, "rule": rule_text(latest.rule)},
        "errors": [],
        **extra,
    }


def _note_page(request: HttpRequest, context: dict[str, Any], *, status: int = 200) -> HttpResponse:
    template = "training/policy_note_detail.html"
    if request.htmx:
        # Errors come back in the swapped part (htmx swaps only 2xx answers).
        return render(request, f"{template}#note", context)
    return render(request, template, context, status=status)


@dashboard_view(VIEW)
def policy_note_detail(request: HttpRequest, note_id: int) -> HttpResponse:
    return _note_page(request, _note_context(request, note_id))


@dashboard_view(PROPOSE)
def policy_note_edit_view(request: HttpRequest, note_id: int) -> HttpResponse:
    if request.method != "POST":
        return redirect("training:policy-note", note_id)
    context = _note_context(request, note_id)
    text, line = request.POST.get("text", ""), request.POST.get("rule", "").strip()
    try:
        rule = rule_from_text(line).as_dict() if line else None
        policy_note_edit(note=context["note"], text=text, rule=rule, user=request.user)
    except RuleError as exc:
        errors = [("rule", str(exc))]
    except PolicyNoteError as exc:
        errors = exc.errors
    else:
        if not request.htmx:
            return redirect("training:policy-note", note_id)
        return _note_page(request, _note_context(request, note_id, saved="Saved as a new version."))
    context.update(errors=errors, form={"text": text, "rule": line})
    return _note_page(request, context, status=400)


@dashboard_view(APPROVE)
def policy_note_approve_view(request: HttpRequest, note_id: int) -> HttpResponse:
    if request.method != "POST":
        return redirect("training:policy-note", note_id)
    context = _note_context(request, note_id)
    try:
        policy_note_approve(note=context["note"], number=parse_id(request.POST.get("version")) or 0, user=request.user)
    except PolicyNoteError as exc:
        context["errors"] = exc.errors
        return _note_page(request, context, status=exc.status)
    if not request.htmx:
        return redirect(reverse("training:policy-note", args=[note_id]))
    return _note_page(request, _note_context(request, note_id, saved="Approved: the judge reads this version now."))
