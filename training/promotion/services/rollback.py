"""Rollback: which version a deployment goes back to, whether it may, and the request that
queues the release putting it live (`training.promotion.services.release` runs it)."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db import transaction

from training.promotion.models import (
    AuditAction,
    PromotionRequest,
    PromotionStatus,
    Release,
    ReleaseKind,
)
from training.promotion.services.promotion_checks import Precondition, check_no_rollout_running, raise_first_unmet
from training.promotion.services.promotion_refused import APPROVE
from training.promotion.services.release import release_in_progress, release_queue, releases_fail_stale
from training.services.audit import audit_record
from training.serving.models import (
    Deployment,
    LiveVersion,
    ModelVersion,
    ModelVersionKind,
    ModelVersionStatus,
)
from training.serving.selectors import live_rollback_target


def rollback_target(*, deployment: Deployment) -> ModelVersion | None:
    """The version a rollback returns to: the most recent one live before the current one
    that the deployment did not withdraw (`live_rollback_target`). A version rolled back
    from is never the target: it comes back only through a new approved request."""
    return live_rollback_target(deployment_id=deployment.pk)[0]


def rollback_check(*, deployment: Deployment, user=None) -> list[Precondition]:
    checks = []
    if user is not None:
        allowed = user.is_authenticated and user.has_perm(APPROVE)
        checks.append(
            Precondition("permission", "Approver", allowed, "" if allowed else f"your role does not include {APPROVE}")
        )
    target, passed = live_rollback_target(deployment_id=deployment.pk)
    if target is not None:
        detail = f"back to {target.name}" + (
            f" (not {', '.join(w.version.name for w in passed)}: withdrawn)" if passed else ""
        )
    elif passed:
        detail = (
            f"{deployment.name} has no earlier version to return to: "
            + "; ".join(w.describe() for w in passed)
            + ". A withdrawn version goes live again only through a new promotion request, approved by another person"
        )
    else:
        detail = f"{deployment.name} has no earlier live version"
    checks.append(Precondition("previous", "A previous version", target is not None, detail, "deployment"))
    if target is not None:
        ok = target.status != ModelVersionStatus.FAILED and target.kind != ModelVersionKind.FULL
        checks.append(
            Precondition("deployable", "Deployable", ok, "" if ok else f"{target.name} cannot be served again")
        )
    running = release_in_progress(deployment=deployment)
    checks.append(
        Precondition(
            "release",
            "No release in progress",
            running is None,
            f"release {running.pk} is in progress" if running else "",
        )
    )
    if running is None:
        checks[-1] = check_no_rollout_running(deployment)
    return checks


@transaction.atomic
def rollback_request(*, deployment: Deployment, user, reason: str = "") -> Release:
    """Return the deployment to its previous version (load if needed, smoke, flip)."""
    checks = rollback_check(deployment=deployment, user=user)
    if checks[0].ok:
        releases_fail_stale()
    if not checks[0].ok:
        raise PermissionDenied(checks[0].detail)
    raise_first_unmet(checks)
    target = rollback_target(deployment=deployment)
    live = LiveVersion.objects.select_related("version").get(deployment=deployment)
    # The request that put the current version live, so its page shows the rollback too.
    undone = (
        PromotionRequest.objects.filter(deployment=deployment, candidate=live.version, status=PromotionStatus.DEPLOYED)
        .order_by("-decided_at", "-id")
        .first()
    )
    release = release_queue(
        deployment=deployment,
        version=target,
        kind=ReleaseKind.ROLLBACK,
        user=user,
        promotion=undone,
        reason=reason or f"rollback from {live.version.name}",
    )
    audit_record(
        action=AuditAction.ROLLBACK_REQUESTED,
        deployment=deployment,
        actor=user,
        from_version=live.version,
        to_version=target,
        promotion=undone,
        release=release,
        detail=reason,
    )
    return release
