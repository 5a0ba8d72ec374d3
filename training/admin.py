from django.contrib import admin

from training.models import BaseModel, LiveVersion, ModelVersion


@admin.register(BaseModel)
class BaseModelAdmin(admin.ModelAdmin):
    list_display = ("name", "path", "created_at")


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ("name", "base_model", "kind", "status", "deployment", "created_at")
    list_filter = ("kind", "status")


@admin.register(LiveVersion)
class LiveVersionAdmin(admin.ModelAdmin):
    list_display = ("deployment", "version", "changed_at", "changed_by")
