"""Releases: putting a version live on the inference server, for a promotion or a rollback.

`release_queue` stores the release and queues `release_run` on the `deploy` queue after
commit. The worker loads the version under its versioned name (a LoRA adapter is
hot-loaded; base weights must already be served), sends one smoke request through the
inference client, then flips the live pointer in one transaction (`live_version_set`).
The gateway reads the pointer per request (cached for a moment, and told of the flip at
once on PostgreSQL), so the next request goes to the new version, while requests in
flight finish on the old one, which stays loaded. Any failure leaves the old version
live and marks the release failed with the reason.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils import timezone

from training.inference.client import InferenceError
from training.promotion.models import (
    ACTIVE_RELEASE_STATUSES,
    AuditAction,
    PromotionRequest,
    PromotionStatus,
    Release,
    ReleaseKind,
    ReleaseStatus,
)
from training.services.audit import audit_record
from training.services.inference import version_server
from training.services.promotion_checks import APPROVE, Precondition, PromotionRefused, raise_first_unmet
from training.serving.models import (
    Deployment,
    LiveVersion,
    LiveVersionChange,
    ModelVersion,
    ModelVersionKind,
    ModelVersionStatus,
)
from training.serving.services import ModelRegistryError, live_version_set

logger = logging.getLogger(__name__)


class ReleaseFailed(Exception):
    """A release step failed; the message is the reason shown on the page. `reached_server`
    is False when the version was refused before anything was sent to the server."""

    def __init__(self, reason: str, *, reached_server: bool = True) -> None:
        super().__init__(reason)
        self.reached_server = reached_server


def _ms_since(start) -> int:
    return int((timezone.now() - start).total_seconds() * 1000)


# Queue ---------------------------------------------------------------------------------


def releases_stale(*, deployment: Deployment):
    """Active releases no worker finished in time (none running, or one that died for good)."""
    cutoff = timezone.now() - timedelta(seconds=settings.RELEASE_STALE_SECONDS)
    return Release.objects.filter(deployment=deployment, status__in=ACTIVE_RELEASE_STATUSES, created_at__lt=cutoff)


def releases_fail_stale(*, deployment: Deployment) -> int:
    """Mark stale releases failed (the live pointer never moved for them), so a new release
    or a rollback is not blocked forever by one that will not finish."""
    count = 0
    for release in releases_stale(deployment=deployment).values_list("pk", flat=True):
        reason = f"not finished within {settings.RELEASE_STALE_SECONDS:.0f} s: is a worker consuming the deploy queue?"
        if _fail(release, reason, unload=False) is not None:
            count += 1
    return count


def release_queue(
    *,
    deployment: Deployment,
    version: ModelVersion,
    kind: str,
    user=None,
    promotion: PromotionRequest | None = None,
    reason: str = "",
) -> Release:
    """Store a release and queue it on the `deploy` queue after the transaction commits."""
    from training.tasks import release_run_task

    live = LiveVersion.objects.filter(deployment=deployment).select_related("version").first()
    try:
        with transaction.atomic():
            release = Release.objects.create(
                deployment=deployment,
                version=version,
                from_version=live.version if live else None,
                kind=kind,
                promotion=promotion,
                requested_by=user if getattr(user, "pk", None) else None,
                reason=reason[:500],
            )
    except IntegrityError as exc:
        raise PromotionRefused(f"another release to {deployment.name} is in progress", field="release") from exc
    release_run_task.apply_async_on_commit(args=[release.pk], queue="deploy")
    return release


# Rollback ------------------------------------------------------------------------------


def rollback_target(*, deployment: Deployment) -> ModelVersion | None:
    """The version that was live before the current one (from the live pointer's history)."""
    live = LiveVersion.objects.filter(deployment=deployment).first()
    if live is None:
        return None
    change = (
        LiveVersionChange.objects.filter(deployment=deployment, to_version_id=live.version_id)
        .select_related("from_version__base_model")
        .order_by("-changed_at", "-id")
        .first()
    )
    return change.from_version if change else None


def rollback_check(*, deployment: Deployment, user=None) -> list[Precondition]:
    checks = []
    if user is not None:
        allowed = user.is_authenticated and user.has_perm(APPROVE)
        checks.append(
            Precondition("permission", "Approver", allowed, "" if allowed else f"your role does not include {APPROVE}")
        )
    target = rollback_target(deployment=deployment)
    checks.append(
        Precondition(
            "previous",
            "A previous version",
            target is not None,
            f"back to {target.name}" if target else f"{deployment.name} has no earlier live version",
        )
    )
    if target is not None:
        ok = target.status != ModelVersionStatus.FAILED and target.kind != ModelVersionKind.FULL
        checks.append(
            Precondition("deployable", "Deployable", ok, "" if ok else f"{target.name} cannot be served again")
        )
    running = (
        Release.objects.filter(deployment=deployment, status__in=ACTIVE_RELEASE_STATUSES)
        .exclude(pk__in=releases_stale(deployment=deployment))
        .first()
    )
    checks.append(
        Precondition(
            "release",
            "No release in progress",
            running is None,
            f"release {running.pk} is in progress" if running else "",
        )
    )
    return checks


@transaction.atomic
def rollback_request(*, deployment: Deployment, user, reason: str = "") -> Release:
    """Return the deployment to its previous version (load if needed, smoke, flip)."""
    checks = rollback_check(deployment=deployment, user=user)
    if checks[0].ok:
        releases_fail_stale(deployment=deployment)
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


# Run (worker) --------------------------------------------------------------------------


def release_load(version: ModelVersion) -> dict[str, Any]:
    """Make the inference server serve `version` under its name."""
    server = version_server(version)
    if version.kind == ModelVersionKind.LORA:
        from training.inference.adapters import adapter_problems

        problems = adapter_problems(version.path)
        if problems:
            raise ReleaseFailed(f"{version.name} was not loaded: " + "; ".join(problems), reached_server=False)
        try:
            server.adapter_load(version.name, version.path, timeout=settings.RELEASE_LOAD_TIMEOUT)
        except InferenceError as exc:
            raise ReleaseFailed(f"loading {version.name} into the inference server failed: {exc}") from exc
        return {"loaded": "lora", "name": version.name}
    if version.kind == ModelVersionKind.FULL:
        raise ReleaseFailed(
            f"{version.name} is a full checkpoint; the shared server hot-loads LoRA adapters only "
            "(serve the checkpoint as its own base model)",
            reached_server=False,
        )
    try:
        served = {m.id for m in server.models()}
    except InferenceError as exc:
        raise ReleaseFailed(f"the inference server for {version.base_model} is not answering: {exc}") from exc
    if version.name not in served:
        raise ReleaseFailed(f"the inference server at {server.url} does not serve {version.name}")
    return {"loaded": "base", "name": version.name}


def release_smoke(version: ModelVersion) -> dict[str, Any]:
    """One short completion from the version: it must answer under its own name with
    tokens whose log-probs are finite (a corrupt adapter gives NaN or an error)."""
    messages = [{"role": "user", "content": settings.RELEASE_SMOKE_PROMPT}]
    started = time.monotonic()
    try:
        result = version_server(version).chat(
            model=version.name,
            messages=messages,
            max_tokens=settings.RELEASE_SMOKE_MAX_TOKENS,
            temperature=0.0,
            timeout=settings.RELEASE_SMOKE_TIMEOUT,
        )
    except InferenceError as exc:
        raise ReleaseFailed(f"smoke request failed: {exc}") from exc
    report = {
        "prompt": settings.RELEASE_SMOKE_PROMPT,
        "model": result.model,
        "content": (result.content or "")[:500],
        "tool_calls": result.tool_calls[:3],
        "finish_reason": result.finish_reason,
        "tokens": len(result.token_ids),
        "latency_ms": round((time.monotonic() - started) * 1000, 1),
    }
    if result.model != version.name:
        raise ReleaseFailed(f"smoke request answered by {result.model!r}, not {version.name!r}")
    if not result.token_ids:
        raise ReleaseFailed("smoke request returned no tokens")
    bad = [lp for lp in result.token_logprobs if not math.isfinite(lp)]
    if bad or len(result.token_logprobs) != len(result.token_ids):
        raise ReleaseFailed(f"smoke request returned non-finite log-probs ({len(bad)} of {len(result.token_ids)})")
    return report


def _lock_active(release_id: int) -> Release | None:
    return (
        Release.objects.select_for_update(of=("self",))
        .select_related("version__base_model", "deployment", "promotion", "requested_by", "from_version")
        .filter(pk=release_id, status__in=ACTIVE_RELEASE_STATUSES)
        .first()
    )


class _ReleaseTakenAway(Exception):
    """The release is no longer active (the stale sweep failed it while this worker was
    busy): the worker stops and writes nothing more."""


def _step(release: Release, status: str, **timings: int) -> None:
    moved = Release.objects.filter(pk=release.pk, status__in=ACTIVE_RELEASE_STATUSES).update(
        status=status, timings={**release.timings, **timings}
    )
    if not moved:
        raise _ReleaseTakenAway()
    release.status = status
    release.timings = {**release.timings, **timings}


def release_run(*, release_id: int, worker: str = "") -> Release | None:
    """Load, smoke-test and flip. A release already live or failed is left alone, so a
    redelivered task does nothing; one interrupted mid-way starts its steps again (each is
    safe to repeat)."""
    with transaction.atomic():
        release = _lock_active(release_id)
        if release is None:
            return Release.objects.filter(pk=release_id).first()
        release.started_at = release.started_at or timezone.now()
        release.worker = worker[:200]
        release.save(update_fields=["started_at", "worker"])
    _step(release, ReleaseStatus.LOADING, picked_up_ms=_ms_since(release.created_at))
    version = release.version
    try:
        loaded = release_load(version)
        _step(release, ReleaseStatus.SMOKE_TEST, loaded_ms=_ms_since(release.created_at))
        audit_record(
            action=AuditAction.RELEASE_LOADED,
            deployment=release.deployment,
            from_version=release.from_version,
            to_version=version,
            promotion=release.promotion,
            release=release,
            data=loaded,
        )
        smoke = release_smoke(version)
        release.timings = {**release.timings, "smoke_ms": _ms_since(release.created_at)}
        if not Release.objects.filter(pk=release.pk, status__in=ACTIVE_RELEASE_STATUSES).update(
            smoke=smoke, timings=release.timings
        ):
            raise _ReleaseTakenAway()
        audit_record(
            action=AuditAction.RELEASE_SMOKE_PASSED,
            deployment=release.deployment,
            from_version=release.from_version,
            to_version=version,
            promotion=release.promotion,
            release=release,
            data=smoke,
        )
        return _flip(release_id)
    except _ReleaseTakenAway:
        logger.warning("release %s: no longer active when its worker resumed; the late run stops", release_id)
        return Release.objects.filter(pk=release_id).first()
    except ReleaseFailed as exc:
        return _fail(release_id, str(exc), unload=exc.reached_server)
    except ModelRegistryError as exc:
        return _fail(release_id, str(exc))
    except Exception as exc:
        logger.exception("release %s failed", release_id)
        return _fail(release_id, f"{type(exc).__name__}: {exc}")


@transaction.atomic
def _flip(release_id: int) -> Release | None:
    release = _lock_active(release_id)
    if release is None:
        return Release.objects.filter(pk=release_id).first()
    version = release.version
    before = LiveVersion.objects.filter(deployment=release.deployment).select_related("version").first()
    previous = before.version if before else None
    live_version_set(
        deployment=release.deployment,
        version=version,
        user=release.requested_by,
        reason=f"{release.get_kind_display().lower()} (release {release.pk})",
    )
    timings = {**release.timings, "live_ms": _ms_since(release.created_at)}
    Release.objects.filter(pk=release.pk).update(status=ReleaseStatus.LIVE, finished_at=timezone.now(), timings=timings)
    if release.kind == ReleaseKind.PROMOTION and release.promotion_id:
        PromotionRequest.objects.filter(pk=release.promotion_id).update(status=PromotionStatus.DEPLOYED)
    if release.kind == ReleaseKind.ROLLBACK and previous is not None:
        PromotionRequest.objects.filter(
            deployment=release.deployment, candidate=previous, status=PromotionStatus.DEPLOYED
        ).update(status=PromotionStatus.ROLLED_BACK)
    audit_record(
        action=AuditAction.LIVE_SWITCHED,
        deployment=release.deployment,
        actor=release.requested_by,
        from_version=previous,
        to_version=version,
        promotion=release.promotion,
        release=release,
        detail=release.get_kind_display(),
        data={"timings_ms": timings},
    )
    release.refresh_from_db()
    return release


def _fail(release_id: int, reason: str, *, unload: bool = True) -> Release | None:
    with transaction.atomic():
        release = _lock_active(release_id)
        if release is None:
            return Release.objects.filter(pk=release_id).first()
        timings = {**release.timings, "failed_ms": _ms_since(release.created_at)}
        Release.objects.filter(pk=release.pk).update(
            status=ReleaseStatus.FAILED, error=reason[:5000], finished_at=timezone.now(), timings=timings
        )
        if release.kind == ReleaseKind.PROMOTION and release.promotion_id:
            PromotionRequest.objects.filter(pk=release.promotion_id).update(status=PromotionStatus.FAILED)
        live = LiveVersion.objects.filter(deployment=release.deployment).select_related("version").first()
        audit_record(
            action=AuditAction.RELEASE_FAILED,
            deployment=release.deployment,
            from_version=live.version if live else None,
            to_version=release.version,
            promotion=release.promotion,
            release=release,
            detail=reason,
        )
    version = release.version
    # A broken adapter should not linger in the server; one some deployment serves stays.
    if (
        unload
        and release.kind == ReleaseKind.PROMOTION
        and version.kind == ModelVersionKind.LORA
        and not LiveVersion.objects.filter(version=version).exists()
    ):
        try:
            version_server(version).adapter_unload(version.name)
        except InferenceError as exc:
            logger.warning("could not unload %s after a failed release: %s", version.name, exc)
    release.refresh_from_db()
    return release
