from django.contrib import admin

from feedback.models import ApiKey, Deployment, Message, Trace


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
