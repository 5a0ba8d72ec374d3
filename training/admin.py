from django.contrib import admin
from django.contrib import messages as admin_messages
from django.core.exceptions import PermissionDenied

from training.promotion.models import (
    AuditEvent,
    Evaluation,
    PromotionRequest,
    Release,
)
from training.promotion.services.evaluation import EvaluationError, evaluation_cancel
from training.promotion.services.promotion import promotion_approve, promotion_reject
from training.promotion.services.promotion_checks import PromotionRefused
from training.promotion.services.rollback import rollback_request
from training.serving.admin import LiveVersionAdmin, ReadOnlyAdmin

# Evaluation, promotion, release and the audit log: read-only here. Decisions go through the
# same services as the pages and the API (the actions below), so the rules and the audit
# trail are the same whichever way a person acts.


def _each(modeladmin, request, queryset, act, done: str) -> None:
    for obj in queryset:
        try:
            act(obj)
        except (PermissionDenied, PromotionRefused, EvaluationError) as exc:
            modeladmin.message_user(request, f"{obj}: {exc}", admin_messages.ERROR)
        else:
            modeladmin.message_user(request, f"{obj}: {done}", admin_messages.SUCCESS)


@admin.register(PromotionRequest)
class PromotionRequestAdmin(ReadOnlyAdmin):
    list_display = ("id", "deployment", "from_version", "candidate", "status", "requested_by", "decided_by")
    list_filter = ("status", "deployment")
    actions = ["approve", "reject"]

    @admin.action(description="Approve and deploy (not your own requests)")
    def approve(self, request, queryset) -> None:
        _each(
            self,
            request,
            queryset,
            lambda p: promotion_approve(promotion=p, user=request.user, comment="approved in the admin"),
            "approved; release queued",
        )

    @admin.action(description="Reject")
    def reject(self, request, queryset) -> None:
        _each(
            self,
            request,
            queryset,
            lambda p: promotion_reject(promotion=p, user=request.user, comment="rejected in the admin"),
            "rejected",
        )


@admin.register(Release)
class ReleaseAdmin(ReadOnlyAdmin):
    list_display = ("id", "deployment", "kind", "from_version", "version", "status", "step", "created_at", "error")
    list_filter = ("status", "kind", "deployment")


@admin.register(Evaluation)
class EvaluationAdmin(ReadOnlyAdmin):
    list_display = ("id", "deployment", "candidate", "baseline", "status", "done", "total", "created_at")
    list_filter = ("status", "deployment")
    actions = ["cancel"]

    @admin.action(description="Cancel")
    def cancel(self, request, queryset) -> None:
        _each(self, request, queryset, lambda e: evaluation_cancel(evaluation=e, user=request.user), "cancelling")


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor_name", "action", "deployment", "from_version", "to_version", "detail")
    list_filter = ("action", "deployment")
    date_hierarchy = "at"


@admin.action(description="Roll back to the version live before")
def rollback_action(modeladmin, request, queryset) -> None:
    _each(
        modeladmin,
        request,
        queryset,
        lambda live: rollback_request(deployment=live.deployment, user=request.user, reason="rolled back in the admin"),
        "rollback queued",
    )


# A rollback is a release (this app's), so the serving app's live-pointer admin gets the
# action from here: serving imports nothing above it.
LiveVersionAdmin.actions = [rollback_action]
