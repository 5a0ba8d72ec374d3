from django.contrib import admin

from training.models import BaseModel, LiveVersion, ModelVersion


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


# Read-only, for everyone: a base model's weights folder and inference server, a version's
# folder, kind and status decide what answers customers. They are set when registered
# (`prepare_model`, `register_version`, a training job) and change only through a release
# (approved by a second person, audited).
@admin.register(BaseModel)
class BaseModelAdmin(ReadOnlyAdmin):
    list_display = ("name", "path", "inference_url", "created_at")


@admin.register(ModelVersion)
class ModelVersionAdmin(ReadOnlyAdmin):
    list_display = ("name", "base_model", "kind", "status", "deployment", "created_at")
    list_filter = ("kind", "status")


@admin.register(LiveVersion)
class LiveVersionAdmin(ReadOnlyAdmin):
    """Read-only: a flip goes through a release (load, smoke, audit) or `manage.py set_live`."""

    list_display = ("deployment", "version", "changed_at", "changed_by")


# Evaluation, promotion, release and the audit log: read-only here. Decisions go through the
# same services as the pages and the API (the actions below), so the rules and the audit
# trail are the same whichever way a person acts.
from django.contrib import messages as admin_messages  # noqa: E402
from django.core.exceptions import PermissionDenied  # noqa: E402

from training.models_promotion import (  # noqa: E402
    AuditEvent,
    Evaluation,
    PromotionRequest,
    Release,
)


def _each(modeladmin, request, queryset, act, done: str) -> None:
    from training.services.evaluation import EvaluationError
    from training.services.promotion_checks import PromotionRefused

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
        from training.services.promotion import promotion_approve

        _each(
            self,
            request,
            queryset,
            lambda p: promotion_approve(promotion=p, user=request.user, comment="approved in the admin"),
            "approved; release queued",
        )

    @admin.action(description="Reject")
    def reject(self, request, queryset) -> None:
        from training.services.promotion import promotion_reject

        _each(
            self,
            request,
            queryset,
            lambda p: promotion_reject(promotion=p, user=request.user, comment="rejected in the admin"),
            "rejected",
        )


@admin.register(Release)
class ReleaseAdmin(ReadOnlyAdmin):
    list_display = ("id", "deployment", "kind", "from_version", "version", "status", "created_at", "error")
    list_filter = ("status", "kind", "deployment")


@admin.register(Evaluation)
class EvaluationAdmin(ReadOnlyAdmin):
    list_display = ("id", "deployment", "candidate", "baseline", "status", "done", "total", "created_at")
    list_filter = ("status", "deployment")
    actions = ["cancel"]

    @admin.action(description="Cancel")
    def cancel(self, request, queryset) -> None:
        from training.services.evaluation import evaluation_cancel

        _each(self, request, queryset, lambda e: evaluation_cancel(evaluation=e, user=request.user), "cancelling")


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor_name", "action", "deployment", "from_version", "to_version", "detail")
    list_filter = ("action", "deployment")
    date_hierarchy = "at"


@admin.action(description="Roll back to the version live before")
def rollback_action(modeladmin, request, queryset) -> None:
    from training.services.release import rollback_request

    _each(
        modeladmin,
        request,
        queryset,
        lambda live: rollback_request(deployment=live.deployment, user=request.user, reason="rolled back in the admin"),
        "rollback queued",
    )


LiveVersionAdmin.actions = [rollback_action]
