"""The release page of a progressive release, its buttons, and its API.

The page draws each step (the candidate's share over time), both versions' signals with their
intervals as the checks read them, and every change with who or "automatic" decided it and
why; while the rollout is under way its panel reloads itself (htmx). The buttons and the reason
sit outside that panel, so a redraw never wipes what is being typed, and they post the step the
page was loaded at: a move since is refused (409), not applied to a step nobody saw. Hold, resume,
advance and roll back post to views that call the services the API calls
(`training.promotion.services.rollouts`): the same permission (403), the same state rules (409) and four
eyes for all traffic early.
The API is `training.promotion.rollout_apis`.
"""

from __future__ import annotations

from django.contrib import messages as flash
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from training.promotion.rollout_charts import rollout_charts
from training.promotion.rollout_models import Rollout
from training.promotion.services.promotion_checks import PromotionRefused
from training.promotion.services.promotion_refused import APPROVE
from training.promotion.services.rollouts import rollout_advance, rollout_hold, rollout_resume, rollout_rollback
from webapp.kernel.errors import Invalid
from webapp.kernel.ids import parse_id
from webapp.kernel.pages import dashboard_view

ACTIONS = {
    "hold": rollout_hold,
    "resume": rollout_resume,
    "advance": rollout_advance,
    "rollback": rollout_rollback,
}
AUDIT = "training.view_auditevent"
JOINS = ("deployment", "candidate", "baseline", "promotion__requested_by", "promotion__decided_by", "release")


def _rollout(rollout_id: int) -> Rollout:
    return get_object_or_404(Rollout.objects.select_related(*JOINS), pk=rollout_id)


def _context(request: HttpRequest, rollout: Rollout) -> dict:
    may_act = request.user.has_perm(APPROVE)
    # Where the rollout stood when the page was loaded: its form posts that, and the panel,
    # redrawn every 2 s, warns once the rollout has moved on from there.
    seen = {"step": rollout.step, "state": rollout.state}
    if request.GET.get("part") == "panel" and "seen_step" in request.GET:
        seen = {"step": parse_id(request.GET.get("seen_step", "")), "state": request.GET.get("seen_state", "")}
    return {
        "rollout": rollout,
        "changes": list(rollout.changes.select_related("actor")),
        "charts": rollout_charts(rollout),
        "last": rollout.last_check or {},
        "may_act": may_act and rollout.active,
        "final_next": rollout.step + 1 >= len(rollout.steps) - 1,
        "seen": seen,
        "moved": (seen["step"], seen["state"]) != (rollout.step, rollout.state),
    }


@dashboard_view(AUDIT)
def rollout_detail(request: HttpRequest, rollout_id: int) -> HttpResponse:
    rollout = _rollout(rollout_id)
    template = "training/rollout.html#panel" if request.GET.get("part") == "panel" else "training/rollout.html"
    return render(request, template, _context(request, rollout))


def _seen(post) -> dict:
    """The step and share the form was drawn at (absent: not checked)."""
    seen: dict = {"seen_step": None, "seen_share": None}
    if post.get("step", "") != "":
        seen["seen_step"] = parse_id(post["step"])
        if seen["seen_step"] is None:
            raise Invalid("a step number", field="step")
    if post.get("share", "") != "":
        try:
            seen["seen_share"] = float(post["share"])
        except ValueError:
            raise Invalid("a share from 0 to 1", field="share") from None
    return seen


@require_POST
@dashboard_view(APPROVE)
def rollout_action_view(request: HttpRequest, rollout_id: int, action: str) -> HttpResponse:
    act = ACTIONS.get(action)
    if act is None:
        raise Http404("no such action")
    rollout = _rollout(rollout_id)
    try:
        act(rollout=rollout, user=request.user, reason=request.POST.get("reason", "")[:500], **_seen(request.POST))
    except Invalid as exc:
        flash.error(request, exc.detail)
    except (PermissionDenied, PromotionRefused) as exc:
        flash.error(request, str(exc))
    else:
        flash.success(request, f"Progressive release {rollout.pk}: {action} done.")
    return redirect("promotion:rollout", rollout_id=rollout.pk)
