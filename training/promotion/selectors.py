"""Reads for the evaluation, promotion, release and audit pages and APIs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from training.promotion.models import (
    AuditAction,
    AuditEvent,
    Evaluation,
    EvaluationItem,
    PromotionRequest,
    PromotionStatus,
    Release,
)
from training.promotion.services.rollback import rollback_target
from training.serving.models import Deployment, LiveVersion, LiveVersionChange, ModelVersion, ModelVersionStatus
from webapp.kernel.ids import parse_id


def evaluation_get(*, evaluation_id: int) -> Evaluation | None:
    return (
        Evaluation.objects.select_related(
            "candidate__base_model", "baseline", "deployment", "created_by", "training_set"
        )
        .filter(pk=evaluation_id)
        .first()
    )


def evaluation_items_source(*, evaluation: Evaluation) -> str:
    """What an evaluation measured the candidate on, in words: the held-out items of a
    training set (by name), an environment's episodes, hand-picked traces, given items."""
    sources = evaluation.sources or {}
    parts = []
    if isinstance(sources.get("training_set"), dict):
        parts.append(f"held-out items of {sources['training_set'].get('name', '')}")
    if isinstance(sources.get("environment"), dict):
        env = sources["environment"]
        parts.append(f"{env.get('tasks', '')} {env.get('name', '')} episodes ({env.get('split', '')} tasks)")
    if sources.get("traces"):
        parts.append(f"{len(sources['traces'])} hand-picked traces")
    if sources.get("given"):
        parts.append(f"{sources['given']} given items")
    return "; ".join(parts) or "—"


def evaluation_items(*, evaluation: Evaluation) -> QuerySet[EvaluationItem]:
    return evaluation.items.order_by("position")


def evaluations_recent(*, limit: int = 30) -> list[Evaluation]:
    return list(Evaluation.objects.select_related("candidate", "baseline", "deployment", "created_by")[:limit])


def promotion_get(*, promotion_id: int) -> PromotionRequest | None:
    return (
        PromotionRequest.objects.select_related(
            "candidate__base_model",
            "candidate__parent",
            "deployment",
            "from_version",
            "evaluation__baseline",
            "requested_by",
            "decided_by",
        )
        .filter(pk=promotion_id)
        .first()
    )


def promotions_recent(*, limit: int = 50, status: str | None = None) -> list[PromotionRequest]:
    qs = PromotionRequest.objects.select_related(
        "candidate", "deployment", "from_version", "requested_by", "decided_by"
    )
    if status:
        qs = qs.filter(status=status)
    return list(qs[:limit])


def release_get(*, release_id: int) -> Release | None:
    return (
        Release.objects.select_related("version", "from_version", "deployment", "promotion", "requested_by")
        .prefetch_related("rollouts")
        .filter(pk=release_id)
        .first()
    )


def releases_of(*, promotion: PromotionRequest) -> list[Release]:
    # A progressive release's state reads its rollout's (`Release.state`).
    releases = promotion.releases.select_related("version", "from_version").prefetch_related("rollouts")
    return list(releases.order_by("-created_at", "-id"))


# The audit log: its events and the live pointer's trail, in one list ----------------------


class LiveMove:
    """A move of a deployment's live pointer as the audit log shows it, beside its events
    (the attributes a page and `audit_as_dict` read of an `AuditEvent`). The row is the
    pointer's trail (`LiveVersionChange`), the one record of every route to live, written by
    `live_version_set` in the move's transaction."""

    action = AuditAction.LIVE_SWITCHED
    pk = None  # not an audit event: `audit_cursor_text` names it
    evaluation_id = None

    def __init__(self, change: LiveVersionChange) -> None:
        self.change = change
        self.at = change.changed_at
        self.actor_name = change.changed_by.username if change.changed_by_id else ""
        self.deployment = change.deployment
        self.from_version, self.to_version = change.from_version, change.to_version
        self.promotion_id, self.release_id = change.promotion_id, change.release_id
        self.detail = change.reason
        self.data = {"kind": change.kind}

    def get_action_display(self) -> str:
        return f"{AuditAction.LIVE_SWITCHED.label} · {self.change.get_kind_display()}"


AuditEntry = AuditEvent | LiveMove
LIVE_CURSOR = "live-"


@dataclass(frozen=True, slots=True, order=True)
class AuditCursor:
    """Where a page of the audit log ends: entries are ordered by (time, table, id), newest
    first, so the two tables page as one list. `rank` 1 is an event, 0 a live move."""

    at: datetime
    rank: int
    id: int


def _key(entry: AuditEntry) -> AuditCursor:
    if isinstance(entry, LiveMove):
        return AuditCursor(entry.at, 0, entry.change.pk)
    return AuditCursor(entry.at, 1, entry.pk)


def audit_cursor_text(entry: AuditEntry) -> int | str:
    """What `before` takes to go on after `entry`: an event's id, or `live-<id>` for a move."""
    return f"{LIVE_CURSOR}{entry.change.pk}" if isinstance(entry, LiveMove) else entry.pk


def audit_cursor(value: str) -> AuditCursor | None:
    """The entry `value` names (`audit_cursor_text`), or None when it names none."""
    if value.startswith(LIVE_CURSOR):
        pk = parse_id(value.removeprefix(LIVE_CURSOR))
        at = LiveVersionChange.objects.filter(pk=pk).values_list("changed_at", flat=True).first() if pk else None
        return AuditCursor(at, 0, pk) if at else None
    pk = parse_id(value)
    at = AuditEvent.objects.filter(pk=pk).values_list("at", flat=True).first() if pk else None
    return AuditCursor(at, 1, pk) if at else None


def _older(cursor: AuditCursor | None, *, rank: int, at: str) -> Q:
    """The rows of one table (all of rank `rank`, their time in field `at`) after `cursor`."""
    if cursor is None:
        return Q()
    if rank != cursor.rank:
        return Q(**{f"{at}__lte" if rank < cursor.rank else f"{at}__lt": cursor.at})
    return Q(**{f"{at}__lt": cursor.at}) | Q(**{at: cursor.at, "id__lt": cursor.id})


def audit_trail(
    *, deployment: Deployment | None = None, before: AuditCursor | None = None, limit: int = 100
) -> list[AuditEntry]:
    """The audit log, newest first, keyset-paged: its events and every move of a live pointer.
    The `live_switched` events written before the trail was the record are left out: each of
    those moves is the trail's row (migration training 0024)."""
    events = AuditEvent.objects.select_related("deployment", "from_version", "to_version").exclude(
        action=AuditAction.LIVE_SWITCHED
    )
    moves = LiveVersionChange.objects.select_related("deployment", "from_version", "to_version", "changed_by")
    if deployment is not None:
        events, moves = events.filter(deployment=deployment), moves.filter(deployment=deployment)
    entries: list[AuditEntry] = [
        *events.filter(_older(before, rank=1, at="at")).order_by("-at", "-id")[:limit],
        *map(LiveMove, moves.filter(_older(before, rank=0, at="changed_at")).order_by("-changed_at", "-id")[:limit]),
    ]
    return sorted(entries, key=_key, reverse=True)[:limit]


def promotion_audit(*, promotion: PromotionRequest) -> list[AuditEntry]:
    """A request's own audit trail, oldest first: its events and the moves of the live pointer
    its releases made (to its candidate, or back from it by a rollback)."""
    events = promotion.audit_events.select_related("deployment", "from_version", "to_version").exclude(
        action=AuditAction.LIVE_SWITCHED
    )
    moves = LiveVersionChange.objects.filter(promotion_id=promotion.pk).select_related(
        "deployment", "from_version", "to_version", "changed_by"
    )
    return sorted([*events, *map(LiveMove, moves)], key=_key)


@dataclass
class DeploymentState:
    deployment: Deployment
    live: ModelVersion | None
    rollback_to: ModelVersion | None
    active_release: Release | None
    recent_releases: list[Release]


def deployment_states() -> list[DeploymentState]:
    """Each deployment's live version, the version a rollback would return to, and releases."""
    lives = {
        lv.deployment_id: lv.version for lv in LiveVersion.objects.select_related("version__base_model", "deployment")
    }
    releases: dict[int, list[Release]] = {}
    rows = Release.objects.select_related("version", "from_version").prefetch_related("rollouts")
    for release in rows.order_by("-created_at", "-id")[:200]:
        releases.setdefault(release.deployment_id, []).append(release)
    out = []
    for deployment in Deployment.objects.order_by("name"):
        recent = releases.get(deployment.pk, [])[:5]
        out.append(
            DeploymentState(
                deployment=deployment,
                live=lives.get(deployment.pk),
                rollback_to=rollback_target(deployment=deployment) if deployment.pk in lives else None,
                active_release=next((r for r in recent if r.is_active), None),
                recent_releases=recent,
            )
        )
    return out


def candidate_versions(*, limit: int = 50) -> list[ModelVersion]:
    """Versions that could be promoted: candidates and approved versions, newest first."""
    return list(
        ModelVersion.objects.select_related("base_model", "parent", "deployment", "produced_by_job")
        .filter(status__in=[ModelVersionStatus.CANDIDATE, ModelVersionStatus.APPROVED])
        .exclude(kind="base")[:limit]
    )


def latest_evaluation(*, candidate: ModelVersion, deployment: Deployment) -> Evaluation | None:
    return Evaluation.objects.filter(candidate=candidate, deployment=deployment).order_by("-created_at", "-id").first()


def pending_promotions_count() -> int:
    return PromotionRequest.objects.filter(status=PromotionStatus.PENDING).count()


# As JSON (API) ---------------------------------------------------------------------------


def _name(version: ModelVersion | None) -> str | None:
    return version.name if version is not None else None


def evaluation_as_dict(e: Evaluation, *, items: list[EvaluationItem] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": e.pk,
        "deployment": e.deployment.name,
        "candidate": e.candidate.name,
        "baseline": e.baseline.name,
        "status": e.status,
        "progress": {"done": e.done, "total": e.total},
        "config": e.config,
        "training_set": e.training_set_id,
        "sources": e.sources,
        "summary": e.summary,
        "error": e.error or None,
        "created_by": e.created_by.username if e.created_by else None,
        "created_at": e.created_at.isoformat(),
        "finished_at": e.finished_at.isoformat() if e.finished_at else None,
    }
    if items is not None:
        out["items"] = [evaluation_item_as_dict(i) for i in items]
    return out


def evaluation_item_as_dict(i: EvaluationItem) -> dict[str, Any]:
    return {
        "position": i.position,
        "kind": i.kind,
        "key": i.key,
        "source": i.source,
        "messages": i.messages,
        "tools": i.tools,
        "rubric": i.rubric,
        "reference": i.reference or None,
        "grader": i.grader or None,
        "logged_response": i.logged_response,
        "done": i.done,
        "candidate": i.candidate,
        "baseline": i.baseline,
        "outcome": i.outcome or None,
        "kl": i.kl,
        "judge_error": i.judge_error or None,
    }


def release_as_dict(r: Release) -> dict[str, Any]:
    return {
        "id": r.pk,
        "kind": r.kind,
        "deployment": r.deployment.name,
        "version": r.version.name,
        "from_version": _name(r.from_version),
        "promotion": r.promotion_id,
        "status": r.status,
        "step": r.step or None,
        "error": r.error or None,
        "smoke": r.smoke,
        "timings_ms": r.timings,
        # A release approved with a plan loads the candidate for a progressive release: follow
        # it at `GET rollouts/<id>`.
        "rollout": next((ro.pk for ro in r.rollouts.all()), None),
        "requested_by": r.requested_by.username if r.requested_by else None,
        "created_at": r.created_at.isoformat(),
        "finished_at": r.finished_at.isoformat() if r.finished_at else None,
    }


def promotion_as_dict(p: PromotionRequest, *, preconditions: list | None = None) -> dict[str, Any]:
    out = {
        "id": p.pk,
        "deployment": p.deployment.name,
        "candidate": p.candidate.name,
        "from_version": _name(p.from_version),
        "evaluation": p.evaluation_id,
        "status": p.status,
        "note": p.note,
        "breach_override_reason": p.breach_override_reason or None,
        "rebase_reason": p.rebase_reason or None,
        "requested_by": p.requested_by.username,
        "requested_at": p.requested_at.isoformat(),
        "decided_by": p.decided_by.username if p.decided_by else None,
        "decided_at": p.decided_at.isoformat() if p.decided_at else None,
        "decision_comment": p.decision_comment or None,
        "snapshot": p.snapshot,
        "releases": [release_as_dict(r) for r in releases_of(promotion=p)],
    }
    if preconditions is not None:
        out["preconditions"] = [c.as_dict() for c in preconditions]
    return out


def promotion_summary_as_dict(p: PromotionRequest) -> dict[str, Any]:
    """A request without its snapshot and releases (for lists)."""
    return {
        "id": p.pk,
        "deployment": p.deployment.name,
        "candidate": p.candidate.name,
        "from_version": _name(p.from_version),
        "evaluation": p.evaluation_id,
        "status": p.status,
        "requested_by": p.requested_by.username,
        "requested_at": p.requested_at.isoformat(),
        "decided_by": p.decided_by.username if p.decided_by else None,
        "decided_at": p.decided_at.isoformat() if p.decided_at else None,
    }


def audit_as_dict(a: AuditEntry) -> dict[str, Any]:
    """An entry of the audit log; a move of a live pointer has no event id (`id` null) and
    names its row of the trail (`live_change`), with how it moved in `data.kind`."""
    return {
        "id": a.pk,
        "live_change": a.change.pk if isinstance(a, LiveMove) else None,
        "at": a.at.isoformat(),
        "actor": a.actor_name or None,
        "action": a.action,
        "deployment": a.deployment.name if a.deployment is not None else None,
        "from_version": _name(a.from_version),
        "to_version": _name(a.to_version),
        "evaluation": a.evaluation_id,
        "promotion": a.promotion_id,
        "release": a.release_id,
        "detail": a.detail or None,
        "data": a.data,
    }
