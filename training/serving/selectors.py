"""Reads of what is deployed and which version is live."""

from __future__ import annotations

from django.conf import settings

from training.inference.client import server_root
from training.serving.models import BaseModel, LiveVersion, ModelVersion


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


def base_model_replica_urls(*, base: BaseModel) -> list[str]:
    """The root URLs of the servers that serve `base`: its `inference_url` (blank: the site's
    `INFERENCE_URL`) first, then its `inference_replicas`, each once. Every reader of "where
    is this base model served" goes through here: the gateway, releases, `set_live`, the
    rollouts' allowed servers."""
    out: list[str] = []
    for url in [base.inference_url or settings.INFERENCE_URL, *(base.inference_replicas or [])]:
        root = server_root(str(url))
        if root and root not in out:
            out.append(root)
    return out
