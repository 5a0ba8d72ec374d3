from django.contrib import admin

from training.serving.models import BaseModel, Deployment, LiveVersion, ModelVersion


@admin.register(Deployment)
class DeploymentAdmin(admin.ModelAdmin):
    list_display = ("name", "stitch_conversations", "created_at")
    search_fields = ("name",)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


# Read-only, for everyone: a base model's weights folder and inference servers, a version's
# folder, kind and status decide what answers customers. They are set when registered
# (`prepare_model`, `register_version`, a training job) and change only through a release
# (approved by a second person, audited); the replicas by whoever runs the servers
# (`serve_inference --replicas`, `manage.py inference_replicas`).
@admin.register(BaseModel)
class BaseModelAdmin(ReadOnlyAdmin):
    list_display = ("name", "path", "inference_url", "inference_replicas", "created_at")


@admin.register(ModelVersion)
class ModelVersionAdmin(ReadOnlyAdmin):
    list_display = ("name", "base_model", "kind", "status", "deployment", "created_at")
    list_filter = ("kind", "status")


@admin.register(LiveVersion)
class LiveVersionAdmin(ReadOnlyAdmin):
    """Read-only: a flip goes through a release (load, smoke, audit) or `manage.py set_live`."""

    list_display = ("deployment", "version", "changed_at", "changed_by")
