"""The canary split: which candidate serves which share of a deployment's conversations.

Set and cleared by a progressive release (`training.promotion.services.rollouts`) in the transaction
that records its step; announced on the live-pointer channel like a flip, so the gateway drops
its cached route at once on PostgreSQL (elsewhere within its TTL).
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from training.serving.models import CanarySplit, Deployment, ModelVersion
from training.serving.services import ModelRegistryError, live_version_announce


@transaction.atomic
def canary_split_set(*, deployment: Deployment, version: ModelVersion, share: float, rollout_id: int) -> CanarySplit:
    """Route `share` (above 0, below 1) of `deployment`'s conversations to `version`."""
    if not 0 < share < 1:
        raise ModelRegistryError(f"a share above 0 and below 1, not {share!r}", field="share")
    split, _ = CanarySplit.objects.update_or_create(
        deployment=deployment,
        defaults={"version": version, "share": share, "rollout_id": rollout_id, "changed_at": timezone.now()},
    )
    live_version_announce(deployment_id=deployment.pk)
    return split


@transaction.atomic
def canary_split_clear(*, deployment: Deployment) -> bool:
    """Send every conversation to the live version again; whether a split was there."""
    deleted, _ = CanarySplit.objects.filter(deployment=deployment).delete()
    if deleted:
        live_version_announce(deployment_id=deployment.pk)
    return bool(deleted)
