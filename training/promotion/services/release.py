"""Releases: putting a version live on the inference server, for a promotion or a rollback.

`release_queue` stores the release and queues `release_run` on the `deploy` queue after
commit. The worker loads the version under its versioned name into every replica of its
base model's server (a LoRA adapter is hot-loaded; base weights must already be served),
sends one smoke request to each through the inference client, then flips the live pointer
(`live_version_set`) in the transaction that ends the release finished; a failure on any
replica fails the release. The version that went out of service is unloaded from every
replica once requests that started on it can no longer be running. A release is a work item (`webapp.kernel.work`): claimed, beaten at each step and ended
through the shared functions, so the stale-work sweep's failure of a release whose worker
went silent and the worker's flip lock the same row, and only one of them happens.
The gateway reads the pointer per request (cached for a moment, and told of the flip at
once on PostgreSQL), so the next request goes to the new version, while requests in
flight finish on the old one, which stays loaded until then. Any failure leaves the old version
live and marks the release failed with the reason. A release that starts a progressive release
(`training.promotion.services.rollouts`) ends where it would flip: the candidate takes its plan's first
share of conversations instead, and the pointer moves only at the plan's last step.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from training.inference.adapters import adapter_problems
from training.inference.client import InferenceClient, InferenceError
from training.promotion.models import (
    AuditAction,
    Evaluation,
    PromotionRequest,
    PromotionStatus,
    Release,
    ReleaseKind,
    ReleaseStep,
)
from training.promotion.services.promotion_refused import PromotionRefused
from training.promotion.services.rollouts import rollout_begin, rollout_release_ended
from training.services.audit import audit_record
from training.services.inference import version_servers
from training.serving.models import (
    CanarySplit,
    Deployment,
    LiveChangeKind,
    LiveVersion,
    ModelVersion,
    ModelVersionKind,
)
from training.serving.services import ModelRegistryError, live_version_set
from training.tasks import release_adapter_unload_task, release_run_task
from webapp.kernel.stale_work import stale_work_settle
from webapp.kernel.work import WorkStatus, work_attempts_exceeded, work_beat, work_claim, work_end, work_worker_name

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


IN_PROGRESS = (WorkStatus.QUEUED, *Release.HELD_STATUSES)


def releases_stale(*, deployment: Deployment | None = None, now: datetime | None = None) -> QuerySet[Release]:
    """Releases in progress that will not finish: queued for over `RELEASE_STALE_SECONDS`
    with no worker taking them, or running with their worker silent that long."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.RELEASE_STALE_SECONDS)
    silent = Q(heartbeat_at__lt=cutoff) | Q(heartbeat_at__isnull=True, started_at__lt=cutoff)
    stale = Release.objects.filter(
        Q(status=WorkStatus.QUEUED, created_at__lt=cutoff) | (Q(status__in=Release.HELD_STATUSES) & silent)
    )
    return stale if deployment is None else stale.filter(deployment=deployment)


def release_in_progress(*, deployment: Deployment) -> Release | None:
    """The deployment's release that is queued or running and not stale, if any."""
    return (
        Release.objects.filter(deployment=deployment, status__in=IN_PROGRESS)
        .exclude(pk__in=releases_stale(deployment=deployment))
        .select_related("version")
        .first()
    )


def releases_fail_stale(*, now: datetime | None = None) -> int:
    """Fail the stale releases (the live pointer never moved for them), so a new release or
    a rollback is not blocked forever by one that will not finish. A running one goes
    through the stale-work sweep's rule; a queued one, which no worker holds, is failed
    here under its row's lock (a worker that takes it meanwhile wins)."""
    now = now or timezone.now()
    limit = settings.RELEASE_STALE_SECONDS
    swept = stale_work_settle(Release, silent_after=limit, now=now, what="release's worker", on_end=_release_ended)
    count = len(swept)
    cutoff = now - timedelta(seconds=limit)
    for pk in Release.objects.filter(status=WorkStatus.QUEUED, created_at__lt=cutoff).values_list("pk", flat=True):
        with transaction.atomic():
            release = (
                Release.objects.select_for_update()
                .filter(pk=pk, status=WorkStatus.QUEUED, created_at__lt=cutoff)
                .first()
            )
            if release is None:
                continue
            release.status, release.finished_at = WorkStatus.FAILED, now
            release.error = f"not picked up within {limit:.0f} s: is a worker consuming the deploy queue?"
            release.save(update_fields=["status", "finished_at", "error"])
            _release_ended(release)
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


# Run (worker) --------------------------------------------------------------------------


def release_load(version: ModelVersion) -> dict[str, Any]:
    """Make every replica of the base model's inference server serve `version` under its
    name: the gateway may send the first request after the flip to any of them."""
    servers = version_servers(version)
    replicas = [server.url for server in servers]

    def where(server: InferenceClient) -> str:
        return f" at {server.url}" if len(servers) > 1 else ""

    if version.kind == ModelVersionKind.LORA:
        problems = adapter_problems(version.path)
        if problems:
            raise ReleaseFailed(f"{version.name} was not loaded: " + "; ".join(problems), reached_server=False)
        for server in servers:
            try:
                server.adapter_load(version.name, version.path, timeout=settings.RELEASE_LOAD_TIMEOUT)
            except InferenceError as exc:
                raise ReleaseFailed(
                    f"loading {version.name} into the inference server{where(server)} failed: {exc}"
                ) from exc
        return {"loaded": "lora", "name": version.name, "replicas": replicas}
    if version.kind == ModelVersionKind.FULL:
        raise ReleaseFailed(
            f"{version.name} is a full checkpoint; the shared server hot-loads LoRA adapters only "
            "(serve the checkpoint as its own base model)",
            reached_server=False,
        )
    for server in servers:
        try:
            served = {m.id for m in server.models()}
        except InferenceError as exc:
            raise ReleaseFailed(
                f"the inference server{where(server)} for {version.base_model} is not answering: {exc}"
            ) from exc
        if version.name not in served:
            raise ReleaseFailed(f"the inference server at {server.url} does not serve {version.name}")
    return {"loaded": "base", "name": version.name, "replicas": replicas}


def _smoke_one(version: ModelVersion, server: InferenceClient, *, several: bool) -> dict[str, Any]:
    messages = [{"role": "user", "content": settings.RELEASE_SMOKE_PROMPT}]
    started = time.monotonic()
    where = f" at {server.url}" if several else ""
    try:
        result = server.chat(
            model=version.name,
            messages=messages,
            max_tokens=settings.RELEASE_SMOKE_MAX_TOKENS,
            temperature=0.0,
            timeout=settings.RELEASE_SMOKE_TIMEOUT,
        )
    except InferenceError as exc:
        raise ReleaseFailed(f"smoke request failed{where}: {exc}") from exc
    report = {
        "replica": server.url,
        "model": result.model,
        "content": (result.content or "")[:500],
        "tool_calls": result.tool_calls[:3],
        "finish_reason": result.finish_reason,
        "tokens": len(result.token_ids),
        "latency_ms": round((time.monotonic() - started) * 1000, 1),
    }
    if result.model != version.name:
        raise ReleaseFailed(f"smoke request{where} answered by {result.model!r}, not {version.name!r}")
    if not result.token_ids:
        raise ReleaseFailed(f"smoke request{where} returned no tokens")
    if not result.content.strip() and not result.tool_calls:
        # Tokens that decode to nothing a customer would read: a version that answers this
        # way to every request serves blank replies, whatever its log-probs.
        cut = " and was cut off at the token limit" if result.finish_reason == "length" else ""
        shown = "an empty answer" if not result.content else f"only whitespace ({result.content[:20]!r})"
        raise ReleaseFailed(
            f"smoke request{where} answered with {shown}{cut} "
            f"(finish_reason {result.finish_reason or 'none'!r}, {len(result.token_ids)} tokens)"
        )
    bad = [lp for lp in result.token_logprobs if not math.isfinite(lp)]
    if bad or len(result.token_logprobs) != len(result.token_ids):
        raise ReleaseFailed(
            f"smoke request{where} returned non-finite log-probs ({len(bad)} of {len(result.token_ids)})"
        )
    return report


def release_smoke(version: ModelVersion) -> dict[str, Any]:
    """One short completion from the version on every replica: each must answer under its
    own name with tokens whose log-probs are finite (a corrupt adapter gives NaN or an
    error) and with text or a tool call (an empty or whitespace-only answer, cut off at the
    token limit or not, fails it). The report is the first replica's answer, with every
    replica's under `replicas`."""
    servers = version_servers(version)
    reports = [_smoke_one(version, server, several=len(servers) > 1) for server in servers]
    first = {k: v for k, v in reports[0].items() if k != "replica"}
    return {"prompt": settings.RELEASE_SMOKE_PROMPT, **first, "replicas": reports}


def release_adapter_unload(*, version_id: int) -> list[str]:
    """Unload a LoRA version from every replica of its base model, unless some deployment
    serves it, a release of it is in progress or an evaluation in progress generates with it;
    best effort (a replica that does not answer is logged and skipped: a restarted one loads
    only the live adapters anyway). Returns the servers it was unloaded from."""
    version = ModelVersion.objects.select_related("base_model").filter(pk=version_id).first()
    if version is None or version.kind != ModelVersionKind.LORA:
        return []
    if LiveVersion.objects.filter(version=version).exists() or CanarySplit.objects.filter(version=version).exists():
        return []
    if Release.objects.filter(version=version, status__in=IN_PROGRESS).exists():
        return []
    # An evaluation generates through the server under the version's name, as candidate or
    # as baseline (the version live when it was asked for, maybe gone out since): unloading
    # it would fail the rest of its items. It stays loaded then (as a replaced version always
    # did before there were replicas); a restarted server loads only the live ones.
    evaluations = Evaluation.objects.filter(Q(candidate=version) | Q(baseline=version))
    if evaluations.filter(status__in=(WorkStatus.QUEUED, *Evaluation.HELD_STATUSES)).exists():
        return []
    unloaded = []
    for server in version_servers(version):
        try:
            server.adapter_unload(version.name)
        except InferenceError as exc:
            logger.warning("could not unload %s from %s: %s", version.name, server.url, exc)
            continue
        unloaded.append(server.url)
    logger.info("unloaded %s from %s", version.name, unloaded or "no server")
    return unloaded


def _unload_later(version: ModelVersion | None) -> None:
    """After a flip, unload the version that went out of service once no request that
    started on it can still be running (`RELEASE_UNLOAD_AFTER_SECONDS`)."""
    if version is None or version.kind != ModelVersionKind.LORA:
        return

    release_adapter_unload_task.apply_async_on_commit(
        args=[version.pk], queue="deploy", countdown=settings.RELEASE_UNLOAD_AFTER_SECONDS
    )


class _ReleaseTakenAway(Exception):
    """The release is no longer this worker's (the stale sweep failed it, a redelivered task
    took it over) or a cancel was asked for: the worker stops and writes nothing more."""


def _beat(release: Release, worker: str, step: str, *, smoke: dict[str, Any] | None = None, **timings: int) -> None:
    release.step, release.timings = step, {**release.timings, **timings}
    progress: dict[str, Any] = {"step": step, "timings": release.timings}
    if smoke is not None:
        release.smoke = progress["smoke"] = smoke
    if not work_beat(Release, pk=release.pk, worker=worker, **progress):
        raise _ReleaseTakenAway()


def release_run(*, release_id: int, worker: str = "") -> Release | None:
    """Load, smoke-test and flip. A release already ended is left alone, so a redelivered
    task does nothing; a redelivery of one still running takes it over at once and starts
    its steps again (each is safe to repeat), and the first worker's later writes change
    nothing."""
    worker = (worker or work_worker_name())[:200]
    claimed = work_claim(Release, pk=release_id, worker=worker, resume_after=0)
    if claimed is None:
        return Release.objects.filter(pk=release_id).first()
    release = Release.objects.select_related(
        "version__base_model", "deployment", "promotion", "requested_by", "from_version"
    ).get(pk=release_id)
    version = release.version
    # Each takeover beats the release's heart, so one whose every worker dies (a crash the
    # broker answers with a redelivery) would never look silent to the sweep and would block
    # its deployment forever: taken over past the limit since it first started, it fails.
    limit = settings.RELEASE_STALE_SECONDS
    if claimed.started_at < timezone.now() - timedelta(seconds=limit):
        return _fail(
            release,
            worker,
            f"not finished within {limit:.0f} s of its first start: its workers kept stopping mid-way; start it again",
            unload=False,
        )
    too_many = work_attempts_exceeded(claimed)
    if too_many:
        return _fail(release, worker, too_many, unload=False)
    try:
        _beat(release, worker, ReleaseStep.LOADING, picked_up_ms=_ms_since(release.created_at))
        loaded = release_load(version)
        _beat(release, worker, ReleaseStep.SMOKE_TEST, loaded_ms=_ms_since(release.created_at))
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
        _beat(release, worker, ReleaseStep.SWITCH, smoke=smoke, smoke_ms=_ms_since(release.created_at))
        audit_record(
            action=AuditAction.RELEASE_SMOKE_PASSED,
            deployment=release.deployment,
            from_version=release.from_version,
            to_version=version,
            promotion=release.promotion,
            release=release,
            data=smoke,
        )
        return _flip(release, worker)
    except _ReleaseTakenAway:
        logger.warning("release %s: no longer this worker's, or a cancel was asked for; the run stops", release_id)
        # Still held only when a cancel was asked for: then it ends cancelled, the old version live.
        return work_end(Release, pk=release_id, worker=worker, status=WorkStatus.CANCELLED, on_end=_release_ended)
    except ReleaseFailed as exc:
        return _fail(release, worker, str(exc), unload=exc.reached_server)
    except ModelRegistryError as exc:
        return _fail(release, worker, str(exc))
    except Exception as exc:
        logger.exception("release %s failed", release_id)
        return _fail(release, worker, f"{type(exc).__name__}: {exc}")


def _flip(release: Release, worker: str) -> Release | None:
    """Flip the live pointer in the transaction that ends the release finished, under its
    row's lock and only while this worker holds it: the pointer moves if and only if the
    release is finished, and never after the sweep failed it."""
    version = release.version
    switched: dict[str, Any] = {}

    def switch(locked: Release) -> list[str]:
        if rollout_begin(release=release):
            # A progressive release: the candidate takes its first step's share, the pointer stays.
            switched["canary"] = True
            locked.step, locked.timings = (
                ReleaseStep.CANARY,
                {**locked.timings, "canary_ms": _ms_since(release.created_at)},
            )
            return ["step", "timings"]
        before = LiveVersion.objects.filter(deployment=release.deployment).select_related("version").first()
        switched["previous"] = previous = before.version if before else None
        promoting = release.kind == ReleaseKind.PROMOTION
        live_version_set(
            deployment=release.deployment,
            version=version,
            user=release.requested_by,
            reason=f"{release.get_kind_display().lower()} (release {release.pk})",
            kind=LiveChangeKind.PROMOTION if promoting else LiveChangeKind.ROLLBACK,
            # The request behind it: a withdrawn version goes live only on a request made since.
            request_made_at=release.promotion.requested_at if promoting and release.promotion_id else None,
            promotion_id=release.promotion_id,
            release_id=release.pk,
        )
        locked.timings = {**locked.timings, "live_ms": _ms_since(release.created_at)}
        if release.kind == ReleaseKind.PROMOTION and release.promotion_id:
            PromotionRequest.objects.filter(pk=release.promotion_id).update(status=PromotionStatus.DEPLOYED)
        if release.kind == ReleaseKind.ROLLBACK and previous is not None:
            PromotionRequest.objects.filter(
                deployment=release.deployment, candidate=previous, status=PromotionStatus.DEPLOYED
            ).update(status=PromotionStatus.ROLLED_BACK)
        return ["timings"]

    def record(ended: Release) -> None:
        # The move itself is in the pointer's trail, written by `live_version_set` above.
        if not switched.get("canary"):
            _unload_later(switched["previous"])

    return work_end(Release, pk=release.pk, worker=worker, status=WorkStatus.FINISHED, settle=switch, on_end=record)


def _release_ended(release: Release) -> None:
    """A release ended without going live (failed or cancelled), by its worker or the
    sweep: the time it ended, its promotion failed, an audit record against the version
    still live."""
    release.timings = {**release.timings, f"{release.status}_ms": _ms_since(release.created_at)}
    release.save(update_fields=["timings"])
    rollout_release_ended(release=release)
    if release.kind == ReleaseKind.PROMOTION and release.promotion_id:
        PromotionRequest.objects.filter(pk=release.promotion_id).update(status=PromotionStatus.FAILED)
    live = LiveVersion.objects.filter(deployment_id=release.deployment_id).select_related("version").first()
    audit_record(
        action=AuditAction.RELEASE_FAILED,
        deployment=release.deployment,
        from_version=live.version if live else None,
        to_version=release.version,
        promotion=release.promotion,
        release=release,
        detail=release.error or f"release {release.get_status_display().lower()}",
    )


def _fail(release: Release, worker: str, reason: str, *, unload: bool = True) -> Release | None:
    ended_here: list[Release] = []

    def on_end(ended: Release) -> None:
        _release_ended(ended)
        ended_here.append(ended)

    outcome = work_end(
        Release, pk=release.pk, worker=worker, status=WorkStatus.FAILED, error=reason[:5000], on_end=on_end
    )
    if not ended_here:
        return outcome
    # A broken adapter should not linger in the servers (every replica it may have reached);
    # one some deployment serves stays.
    if unload and release.kind == ReleaseKind.PROMOTION:
        release_adapter_unload(version_id=release.version_id)
    return outcome
