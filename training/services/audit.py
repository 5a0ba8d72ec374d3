"""The audit log of evaluation, promotion, release and rollback: one append-only row per step.

There is no update or delete path here or anywhere else: the model refuses `save()` on an
existing row and `delete()`, its queryset refuses `update()`/`delete()`, the admin offers
neither, and on PostgreSQL a trigger refuses UPDATE and DELETE (migration 0004).
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from training.promotion.models import AuditEvent, Evaluation, PromotionRequest, Release
from training.serving.models import Deployment, ModelVersion


def audit_record(
    *,
    action: str,
    deployment: Deployment | None,
    actor=None,
    from_version: ModelVersion | None = None,
    to_version: ModelVersion | None = None,
    evaluation: Evaluation | None = None,
    promotion: PromotionRequest | None = None,
    release: Release | None = None,
    detail: str = "",
    data: dict[str, Any] | None = None,
) -> AuditEvent:
    """Append one event. `actor` is the person who acted; None means the system (a worker)."""
    return AuditEvent.objects.create(
        at=timezone.now(),
        actor=actor if getattr(actor, "pk", None) else None,
        actor_name=getattr(actor, "username", "") or "",
        action=action,
        deployment=deployment,
        from_version=from_version,
        to_version=to_version,
        evaluation=evaluation,
        promotion=promotion,
        release=release,
        detail=detail[:5000],
        data=data or {},
    )
