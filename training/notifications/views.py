"""The notifications page: the promotion requests waiting for the signed-in person, each with
its evidence and Approve / Reject buttons that decide it there.

The buttons post to these views, which call the promotion service the request page, the API
and the admin call (`promotion_approve`, `promotion_reject`): the same permission and
four-eyes rule (403), the same preconditions (409 naming the unmet one), a rejection without
a reason a 400 naming `comment`. Approve first answers with the card asking to confirm what
approval does (which deployment, its share of traffic, how to roll back); only a post that
carries that confirmation approves. With htmx the card (asking, or decided) replaces the one
in the page and the nav's count is updated beside it; without, the page comes back with it.
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages as flash
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from training.notifications.selectors import (
    AWAITING_JOINS,
    awaiting_decision,
    promotion_decided_get,
    promotions_awaiting,
    promotions_awaiting_count,
    rollouts_needing_attention,
)
from training.promotion.models import PromotionRequest, PromotionStatus
from training.promotion.services.promotion import (
    ApprovalEffect,
    promotion_approval_effect,
    promotion_approve,
    promotion_approve_refusal,
    promotion_reject,
)
from training.promotion.services.promotion_refused import APPROVE, PromotionRefused
from training.promotion.services.release_plans import release_plan_default
from webapp.kernel.pages import dashboard_view

COMMENT_LIMIT = 5000


def _page(
    request: HttpRequest,
    *,
    errors: dict[int, str] | None = None,
    status: int = 200,
    confirming: dict[int, dict[str, object]] | None = None,
) -> HttpResponse:
    awaiting = promotions_awaiting(user=request.user)
    errors = errors or {}
    shown = {a.promotion.pk for a in awaiting}
    context = {
        "awaiting": awaiting,
        "may_decide": request.user.has_perm(APPROVE),
        "errors": errors,
        "confirming": confirming or {},
        # A request decided meanwhile has no card left to carry its refusal: say it above them.
        "refused": [f"Promotion #{pk}: {error}" for pk, error in errors.items() if pk not in shown],
        "rollouts": rollouts_needing_attention(user=request.user),
    }
    return render(request, "training/notifications.html", context, status=status)


@dashboard_view()
def notifications(request: HttpRequest) -> HttpResponse:
    return _page(request)


class _AskToConfirm(Exception):
    """Approval was asked for without confirming what it does: answer with the confirmation."""

    def __init__(self, effect: ApprovalEffect, comment: str, *, stale: bool) -> None:
        self.effect, self.comment, self.stale = effect, comment, stale


def _fresh(promotion_id: int) -> PromotionRequest:
    return get_object_or_404(PromotionRequest.objects.select_related(*AWAITING_JOINS), pk=promotion_id)


def _decide(
    request: HttpRequest, promotion_id: int, act: Callable[[HttpRequest, PromotionRequest, str], str]
) -> HttpResponse:
    promotion = get_object_or_404(PromotionRequest, pk=promotion_id)
    comment = request.POST.get("comment", "")[:COMMENT_LIMIT]
    try:
        # PermissionDenied (not an approver, or the requester) goes up as a 403.
        done = act(request, promotion, comment)
    except _AskToConfirm as ask:
        if request.htmx:
            context = {
                "a": awaiting_decision(_fresh(promotion_id)),
                "may_decide": True,
                "confirm": ask.effect,
                "comment": ask.comment,
                "stale": ask.stale,
            }
            return render(request, "training/_notification_card.html", context)
        asking = {"effect": ask.effect, "comment": ask.comment, "stale": ask.stale}
        return _page(request, confirming={promotion_id: asking})
    except PromotionRefused as exc:
        status = 400 if exc.field == "comment" else 409
        error = f"{exc.field}: {exc}" if exc.field else str(exc)
        if request.htmx:
            fresh = _fresh(promotion_id)
            still_pending = fresh.status == PromotionStatus.PENDING
            context = {
                "a": awaiting_decision(fresh),
                "error": error,
                # Decided meanwhile (a double click, another approver): nothing left to press,
                # and the nav's count follows.
                "may_decide": still_pending,
                "count": None if still_pending else promotions_awaiting_count(user=request.user),
            }
            return render(request, "training/_notification_card.html", context, status=status)
        return _page(request, errors={promotion_id: error}, status=status)
    if request.htmx:
        context = {
            "decided": promotion_decided_get(promotion_id=promotion_id),
            "done": done,
            "count": promotions_awaiting_count(user=request.user),
        }
        return render(request, "training/_notification_decided.html", context)
    flash.success(request, done)
    return redirect(reverse("notifications:list"))


def _approve(request: HttpRequest, promotion: PromotionRequest, comment: str) -> str:
    # The deployment's default release plan, as the request's page preselects it (the
    # confirmation names it; choosing another is the request page's).
    plan = release_plan_default(deployment=promotion.deployment)
    effect = promotion_approval_effect(promotion=promotion, plan=plan)
    confirmed = request.POST.get("confirm", "")
    if confirmed != effect.token:
        promotion_approve_refusal(promotion=promotion, user=request.user)
        raise _AskToConfirm(effect, comment, stale=bool(confirmed))
    release = promotion_approve(promotion=promotion, user=request.user, comment=comment, plan=effect.plan)
    return (
        f"Approved promotion #{promotion.pk} of {release.version.name} for {release.deployment.name}: "
        f"release {release.pk} is queued; its worker loads, smoke-tests and then switches the live version."
    )


def _reject(request: HttpRequest, promotion: PromotionRequest, comment: str) -> str:
    promotion_reject(promotion=promotion, user=request.user, comment=comment)
    return f"Rejected promotion #{promotion.pk} of {promotion.candidate.name}; nothing changes live."


@require_POST
@dashboard_view(APPROVE)
def notification_approve(request: HttpRequest, promotion_id: int) -> HttpResponse:
    return _decide(request, promotion_id, _approve)


@require_POST
@dashboard_view(APPROVE)
def notification_reject(request: HttpRequest, promotion_id: int) -> HttpResponse:
    return _decide(request, promotion_id, _reject)
