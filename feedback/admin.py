from django.contrib import admin

from feedback.models import (
    AnnotationQueue,
    ApiKey,
    Comment,
    Correction,
    CustomerFeedback,
    Deployment,
    Message,
    Trace,
    TraceFlag,
    TurnRating,
)


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ("name", "created_at")
    search_fields = ("name",)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "deployment", "name", "scopes", "expires_at", "last_used_at", "revoked_at")
    list_filter = ("deployment",)
    readonly_fields = ("prefix", "hashed_secret", "last_used_at", "created_at")

    def has_add_permission(self, request) -> bool:
        # Keys are created with `manage.py create_api_key`, which shows the secret once.
        return False


class MessageInline(admin.TabularInline):
    model = Message
    fields = ("position", "role", "content", "tool_call_id", "finish_reason")
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Trace)
class TraceAdmin(admin.ModelAdmin):
    list_display = ("external_id", "deployment", "environment", "status", "message_count", "started_at")
    list_filter = ("deployment", "status")
    show_full_result_count = False  # no COUNT(*) of a large table
    raw_id_fields = ("model_version",)
    inlines = [MessageInline]


@admin.register(Comment)
class CommentAdmin(admin.ModelAdmin):
    list_display = ("id", "trace", "message", "author", "created_at", "resolved_at")
    raw_id_fields = ("trace", "message", "author", "resolved_by")
    list_filter = ("resolved_at",)


@admin.register(TurnRating)
class TurnRatingAdmin(admin.ModelAdmin):
    list_display = ("id", "trace", "message", "user", "kind", "value", "updated_at")
    raw_id_fields = ("trace", "message", "user")


@admin.register(Correction)
class CorrectionAdmin(admin.ModelAdmin):
    list_display = ("id", "trace", "message", "author", "created_at")
    raw_id_fields = ("trace", "message", "author")


@admin.register(CustomerFeedback)
class CustomerFeedbackAdmin(admin.ModelAdmin):
    list_display = ("id", "deployment", "trace", "source", "rating_kind", "rating", "customer_ref", "created_at")
    list_filter = ("deployment", "source")
    raw_id_fields = ("trace", "message", "api_key")


@admin.register(TraceFlag)
class TraceFlagAdmin(admin.ModelAdmin):
    list_display = ("name", "trace", "source", "created_at")
    list_filter = ("source",)
    raw_id_fields = ("trace",)
    show_full_result_count = False


@admin.register(AnnotationQueue)
class AnnotationQueueAdmin(admin.ModelAdmin):
    list_display = ("name", "item_count", "lock_minutes", "created_by", "created_at")
    raw_id_fields = ("created_by",)
