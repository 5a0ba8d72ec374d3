from django.contrib import admin

from feedback.models import (
    AnnotationQueue,
    ApiKey,
    Comment,
    Correction,
    CustomerFeedback,
    DeploymentJudge,
    FailureModeRun,
    Grade,
    JudgeJob,
    JudgeResult,
    Message,
    Trace,
    TraceFlag,
    TurnRating,
)


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "deployment", "name", "scopes", "expires_at", "last_used_at", "revoked_at")
    list_filter = ("deployment",)
    # Which deployment a key writes to and what it may do are fixed when it is made: a key
    # is never moved to another deployment or widened. Revoke it and make a new one.
    readonly_fields = ("prefix", "hashed_secret", "deployment", "scopes", "last_used_at", "created_at")

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

    def has_change_permission(self, request, obj=None) -> bool:
        # A stored trace is a record of what happened; it is never rewritten.
        return False


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


@admin.register(Grade)
class GradeAdmin(admin.ModelAdmin):
    list_display = ("id", "deployment", "trace", "name", "outcome", "score", "source", "updated_at")
    list_filter = ("deployment", "outcome", "source")
    raw_id_fields = ("trace", "api_key")
    show_full_result_count = False


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


# The judge ------------------------------------------------------------------------------


@admin.register(DeploymentJudge)
class DeploymentJudgeAdmin(admin.ModelAdmin):
    """A deployment's own judge endpoint. The key stays in the environment: give the name
    of the variable that holds it."""

    list_display = ("deployment", "model", "base_url", "api_key_env", "schema_mode", "correction_mode", "updated_at")


@admin.register(JudgeResult)
class JudgeResultAdmin(admin.ModelAdmin):
    list_display = ("id", "trace", "status", "reward", "judge_model", "prompt_version", "is_latest", "created_at")
    list_filter = ("status", "judge_model", "prompt_version", "trigger")
    raw_id_fields = ("trace", "message", "job", "comments", "customer_feedback", "human_corrections")
    show_full_result_count = False

    def has_change_permission(self, request, obj=None) -> bool:
        # A judgement is a record of what the judge said: it is never edited.
        return False


@admin.register(JudgeJob)
class JudgeJobAdmin(admin.ModelAdmin):
    list_display = ("id", "deployment", "status", "total", "succeeded", "failed", "created_at")
    exclude = ("message_ids",)


@admin.register(FailureModeRun)
class FailureModeRunAdmin(admin.ModelAdmin):
    list_display = ("id", "deployment", "status", "traces_scanned", "traces_flagged", "notes_clustered", "created_at")


# Users and roles ------------------------------------------------------------------------
# The admin role manages users (auth.change_user, auth.change_group) but is not a superuser:
# it must not be able to make itself (or anyone) one, grant permissions it does not hold,
# or take over a superuser's account by changing its password. Nor may it hand out, or
# take over an account holding, a role that requests or approves promotions: with a second
# account of its making, one admin would be both people four eyes need. Every change here
# is in the audit log with who made it (training/services/accounts.py).
from django.contrib.auth import get_user_model  # noqa: E402
from django.contrib.auth.admin import GroupAdmin, UserAdmin  # noqa: E402
from django.contrib.auth.models import Group, Permission  # noqa: E402
from django.db.models import Q  # noqa: E402

from webapp.kernel.ids import parse_id  # noqa: E402
from webapp.kernel.roles import superuser_only_permissions  # noqa: E402

User = get_user_model()


def _promoting_permissions() -> Q:
    """The permissions that request or approve promotions (the apps' `superuser_only`)."""
    query = Q(pk__in=[])
    for name in superuser_only_permissions():
        app_label, codename = name.split(".", 1)
        query |= Q(content_type__app_label=app_label, codename=codename)
    return query


def _promotes(account) -> bool:
    """Whether the account can request or approve promotions, active or not (an inactive
    approver reactivated with a new password would be as good as a new one)."""
    permissions = Permission.objects.filter(_promoting_permissions())
    return (
        account.is_superuser
        or account.groups.filter(permissions__in=permissions).exists()
        or account.user_permissions.filter(pk__in=permissions).exists()
    )


def _grantable_groups(user):
    """Groups whose every permission `user` holds: the ones they may hand out. A role that
    requests or approves promotions only a superuser hands out."""
    if user.is_superuser:
        return Group.objects.all()
    held = user.get_all_permissions()
    promoting = superuser_only_permissions()
    return Group.objects.filter(
        pk__in=[
            g.pk
            for g in Group.objects.prefetch_related("permissions__content_type")
            if (names := {f"{p.content_type.app_label}.{p.codename}" for p in g.permissions.all()}) <= held
            and not names & promoting
        ]
    )


class PracticumUserAdmin(UserAdmin):
    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if not request.user.is_superuser:
            fields += ["is_superuser", "user_permissions"]
        return fields

    def has_change_permission(self, request, obj=None) -> bool:
        # The password form asks this too: no password set on such an account either.
        if obj is not None and not request.user.is_superuser and _promotes(obj):
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None) -> bool:
        if obj is not None and not request.user.is_superuser and _promotes(obj):
            return False
        return super().has_delete_permission(request, obj)

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        if db_field.name == "groups" and not request.user.is_superuser:
            # What they may hand out, plus what the edited user already has (kept, not added).
            edited = (request.resolver_match.kwargs if request.resolver_match else {}).get("object_id")
            user_pk = parse_id(edited)
            held = Group.objects.filter(user__pk=user_pk) if user_pk is not None else Group.objects.none()
            kwargs["queryset"] = (_grantable_groups(request.user) | held).distinct()
        return super().formfield_for_manytomany(db_field, request, **kwargs)


class PracticumGroupAdmin(GroupAdmin):
    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if not request.user.is_superuser:
            # A role's permissions come from the code (each app's `AppConfig.roles`), which finds
            # each role by its name: renamed, another group would receive its permissions.
            fields += ["name", "permissions"]
        return fields


admin.site.unregister(User)
admin.site.register(User, PracticumUserAdmin)
admin.site.unregister(Group)
admin.site.register(Group, PracticumGroupAdmin)
