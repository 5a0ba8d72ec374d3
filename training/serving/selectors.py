"""Reads of what is deployed and which version is live."""

from __future__ import annotations

from training.serving.models import LiveVersion, ModelVersion


def live_version_get(*, deployment_id: int) -> ModelVersion | None:
    """The version a deployment serves now, with its base model, or None."""
    live = LiveVersion.objects.select_related("version__base_model").filter(deployment_id=deployment_id).first()
    return live.version if live else None


def live_versions_for_base(*, base_model_id: int) -> list[ModelVersion]:
    """The distinct versions over one base model that some deployment serves now."""
    return list(
        ModelVersion.objects.filter(base_model_id=base_model_id, live_for__isnull=False)
        .select_related("base_model")
        .distinct()
    )
