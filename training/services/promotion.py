"""Promotion requests: asked for by one person, approved or rejected by another.

Check-then-execute: `promotion_request_check` / `promotion_approve_check` return every
precondition with whether it holds (the request page lists them) and the `*_execute`
functions raise `PromotionRefused` naming the first unmet one before changing anything.
Approval queues a release (see `training.services.release`) after commit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils import timezone

from feedback.models import Deployment
from training.models import ModelVersion, ModelVersionKind, ModelVersionStatus
from training.models_promotion import (
    AuditAction,
    Evaluation,
    EvaluationStatus,
    PromotionRequest,
    PromotionStatus,
    Release,
)
from training.selectors import live_version_get
from training.services.audit import audit_record

APPROVE = "training.approve_promotion"
REQUEST = "training.add_promotionrequest"


class PromotionRefused(Exception):
    """A precondition does not hold; `field` names what, the message says why."""

    def __init__(self, reason: str, *, field: str = "", code: str = "") -> None:
        super().__init__(reason)
        self.field = field
        self.code = code


@dataclass(frozen=True, slots=True)
class Precondition:
    code: str
    label: str
    ok: bool
    detail: str
    field: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "label": self.label, "ok": self.ok, "detail": self.detail}


def _raise_first(checks: list[Precondition]) -> None:
    for check in checks:
        if not check.ok:
            raise PromotionRefused(check.detail, field=check.field, code=check.code)


def lineage(version: ModelVersion, *, limit: int = 100) -> list[ModelVersion]:
    """The version and its ancestors, nearest first."""
    chain, seen, current = [], set(), version
    while current is not None and current.pk not in seen and len(chain) < limit:
        chain.append(current)
        seen.add(current.pk)
        current = current.parent
    return chain


def training_job_of(version: ModelVersion):
    """The training job that produced the version, if it was trained here."""
    return getattr(version, "produced_by_job", None)


def monitors_snapshot(version: ModelVersion) -> dict[str, Any]:
    """The producing job's monitor state: breaches, whether it was flagged or stopped."""
    job = training_job_of(version)
    if job is None:
        return {"job": None, "breaches": [], "flagged": False}
    return {
        "job": job.pk,
        "job_status": job.status,
        "flagged": bool(job.flagged),
        "breaches": list(job.breaches or [])[-20:],
        "eval_metrics": job.eval_metrics or {},
    }


def agreement_snapshot(deployment: Deployment) -> dict[str, Any]:
    """The judge's agreement with operators now, per judge version, and the training gate."""
    from feedback.selectors.judge import agreement_as_dict, agreement_by_version, judge_reward_gate

    gate = judge_reward_gate(deployment=deployment)
    return {
        "at": timezone.now().isoformat(),
        "gate": {
            "allowed": gate.allowed,
            "reason": gate.reason,
            "judge_model": gate.judge_model,
            "prompt_version": gate.prompt_version,
            "kappa": gate.kappa,
            "n": gate.n,
        },
        "versions": [agreement_as_dict(row) for row in agreement_by_version(deployment=deployment)],
    }


def _snapshot(candidate: ModelVersion, deployment: Deployment, evaluation: Evaluation) -> dict[str, Any]:
    return {
        "at": timezone.now().isoformat(),
        "monitors": monitors_snapshot(candidate),
        "judge_agreement": agreement_snapshot(deployment),
        "evaluation": {"id": evaluation.pk, "status": evaluation.status, "summary": evaluation.summary},
    }


# Shared preconditions -----------------------------------------------------------------


def _deployable(candidate: ModelVersion) -> Precondition:
    if candidate.status == ModelVersionStatus.FAILED:
        return Precondition("deployable", "Deployable", False, f"{candidate.name} failed", "candidate")
    if candidate.kind == ModelVersionKind.FULL:
        return Precondition(
            "deployable",
            "Deployable",
            False,
            f"{candidate.name} is a full checkpoint: the shared inference server hot-loads LoRA adapters only. "
            "Register the checkpoint as a base model served by its own server (prepare_model local --path … "
            "--name …; serve_inference --base … --port …) and promote that base version",
            "candidate",
        )
    return Precondition("deployable", "Deployable", True, f"{candidate.get_kind_display()} over {candidate.base_model}")


def _evaluation_finished(evaluation: Evaluation, candidate: ModelVersion, deployment: Deployment) -> Precondition:
    label = "Evaluation finished"
    if evaluation.candidate_id != candidate.pk or evaluation.deployment_id != deployment.pk:
        return Precondition(
            "evaluation", label, False, f"evaluation {evaluation.pk} is not of {candidate.name} on {deployment.name}"
        )
    if evaluation.status != EvaluationStatus.FINISHED:
        progress = f", {evaluation.done}/{evaluation.total} items" if evaluation.is_active else ""
        error = f": {evaluation.error[:200]}" if evaluation.error else ""
        return Precondition(
            "evaluation",
            label,
            False,
            f"evaluation {evaluation.pk} is not finished ({evaluation.get_status_display().lower()}{progress}{error})",
            "evaluation",
        )
    return Precondition("evaluation", label, True, f"evaluation {evaluation.pk}: {evaluation.total} items")


def _evaluation_current(evaluation: Evaluation, live: ModelVersion | None) -> Precondition:
    label = "Compared with the live version"
    if live is not None and evaluation.baseline_id != live.pk:
        return Precondition(
            "baseline",
            label,
            False,
            f"evaluation {evaluation.pk} compared against {evaluation.baseline.name}, but {live.name} is live now: "
            "run a new evaluation",
            "evaluation",
        )
    return Precondition("baseline", label, True, f"against {evaluation.baseline.name}")


def _monitors(candidate: ModelVersion, override_reason: str) -> Precondition:
    label = "No monitor breach"
    snap = monitors_snapshot(candidate)
    breaches = snap["breaches"]
    if snap.get("flagged") or breaches or snap.get("job_status") == "stopped":
        what = "; ".join(str(b.get("message", b)) for b in breaches[-3:]) or "the job was flagged"
        if override_reason.strip():
            return Precondition("monitors", label, True, f"breach overridden: {override_reason.strip()[:300]}")
        return Precondition(
            "monitors",
            label,
            False,
            f"training job {snap['job']} breached a monitor ({what}); give a reason to override",
            "breach_override_reason",
        )
    detail = f"training job {snap['job']}: no breach" if snap["job"] else "not trained here: no monitors"
    return Precondition("monitors", label, True, detail)


def _lineage(candidate: ModelVersion, live: ModelVersion | None, rebase_reason: str) -> Precondition:
    label = "Built from the live version"
    if live is None:
        return Precondition("lineage", label, True, "no live version yet")
    if any(v.pk == live.pk for v in lineage(candidate)):
        return Precondition("lineage", label, True, f"{live.name} is an ancestor")
    if rebase_reason.strip():
        return Precondition("lineage", label, True, f"rebased explicitly: {rebase_reason.strip()[:300]}")
    return Precondition(
        "lineage",
        label,
        False,
        f"{candidate.name} was not built from the live version {live.name} (its lineage: "
        f"{' ← '.join(v.name for v in lineage(candidate)[:6])}); rebase explicitly with a reason",
        "rebase_reason",
    )


def _not_live(candidate: ModelVersion, live: ModelVersion | None) -> Precondition:
    ok = live is None or live.pk != candidate.pk
    return Precondition(
        "not_live", "Not live already", ok, "" if ok else f"{candidate.name} is already live", "candidate"
    )


def _no_release_running(deployment: Deployment) -> Precondition:
    from training.models_promotion import ACTIVE_RELEASE_STATUSES
    from training.services.release import releases_stale

    running = (
        Release.objects.filter(deployment=deployment, status__in=ACTIVE_RELEASE_STATUSES)
        .exclude(pk__in=releases_stale(deployment=deployment))
        .first()
    )
    if running is not None:
        return Precondition(
            "release",
            "No release in progress",
            False,
            f"release {running.pk} of {running.version.name} to {deployment.name} is in progress",
        )
    return Precondition("release", "No release in progress", True, "")


# Request -------------------------------------------------------------------------------


def promotion_request_check(
    *,
    candidate: ModelVersion,
    deployment: Deployment,
    evaluation: Evaluation | None,
    breach_override_reason: str = "",
    rebase_reason: str = "",
) -> list[Precondition]:
    live = live_version_get(deployment_id=deployment.pk)
    checks = [_not_live(candidate, live), _deployable(candidate)]
    if evaluation is None:
        checks.append(
            Precondition(
                "evaluation",
                "Evaluation",
                False,
                f"evaluate {candidate.name} against the live version first",
                "evaluation",
            )
        )
    elif evaluation.candidate_id != candidate.pk or evaluation.deployment_id != deployment.pk:
        checks.append(_evaluation_finished(evaluation, candidate, deployment))
    elif evaluation.status in (EvaluationStatus.FAILED, EvaluationStatus.CANCELLED):
        checks.append(
            Precondition(
                "evaluation",
                "Evaluation",
                False,
                f"evaluation {evaluation.pk} {evaluation.status}: run a new one",
                "evaluation",
            )
        )
    else:
        checks.append(Precondition("evaluation", "Evaluation", True, f"evaluation {evaluation.pk}"))
    checks += [_monitors(candidate, breach_override_reason), _lineage(candidate, live, rebase_reason)]
    return checks


@transaction.atomic
def promotion_request_create(
    *,
    candidate: ModelVersion,
    deployment: Deployment,
    evaluation: Evaluation | None,
    requested_by,
    note: str = "",
    breach_override_reason: str = "",
    rebase_reason: str = "",
) -> PromotionRequest:
    """Ask for `candidate` to go live for `deployment`. The evaluation may still be running:
    approval waits for it. Snapshots the monitors and the judge's agreement as they are now."""
    if not requested_by.has_perm(REQUEST):
        raise PermissionDenied(f"your role does not include {REQUEST}")
    _raise_first(
        promotion_request_check(
            candidate=candidate,
            deployment=deployment,
            evaluation=evaluation,
            breach_override_reason=breach_override_reason,
            rebase_reason=rebase_reason,
        )
    )
    live = live_version_get(deployment_id=deployment.pk)
    try:
        with transaction.atomic():
            promotion = PromotionRequest.objects.create(
                deployment=deployment,
                candidate=candidate,
                from_version=live,
                evaluation=evaluation,
                note=note,
                breach_override_reason=breach_override_reason.strip(),
                rebase_reason=rebase_reason.strip(),
                snapshot=_snapshot(candidate, deployment, evaluation),
                requested_by=requested_by,
            )
    except IntegrityError as exc:
        raise PromotionRefused(
            f"{candidate.name} already has a promotion request waiting for {deployment.name}", field="candidate"
        ) from exc
    audit_record(
        action=AuditAction.PROMOTION_REQUESTED,
        deployment=deployment,
        actor=requested_by,
        from_version=live,
        to_version=candidate,
        evaluation=evaluation,
        promotion=promotion,
        detail=note,
        data={
            k: v
            for k, v in {"breach_override_reason": breach_override_reason, "rebase_reason": rebase_reason}.items()
            if v
        },
    )
    return promotion


@transaction.atomic
def promotion_withdraw(*, promotion: PromotionRequest, user) -> PromotionRequest:
    """The requester (or an admin) withdraws a request still waiting for approval."""
    promotion = PromotionRequest.objects.select_for_update().get(pk=promotion.pk)
    if promotion.requested_by_id != user.pk and not user.is_superuser:
        raise PermissionDenied("only the requester withdraws a request")
    if promotion.status != PromotionStatus.PENDING:
        raise PromotionRefused(f"request {promotion.pk} is {promotion.get_status_display().lower()}", field="status")
    promotion.status = PromotionStatus.CANCELLED
    promotion.decided_at = timezone.now()
    promotion.save(update_fields=["status", "decided_at"])
    audit_record(
        action=AuditAction.PROMOTION_WITHDRAWN,
        deployment=promotion.deployment,
        actor=user,
        from_version=promotion.from_version,
        to_version=promotion.candidate,
        promotion=promotion,
    )
    return promotion


# Approve / reject ----------------------------------------------------------------------


def _decider(promotion: PromotionRequest, user) -> list[Precondition]:
    allowed = user.is_authenticated and user.has_perm(APPROVE)
    other = promotion.requested_by_id != user.pk
    return [
        Precondition(
            "permission",
            "Approver",
            allowed,
            "" if allowed else f"your role does not include {APPROVE}",
        ),
        Precondition(
            "four_eyes",
            "Not the requester",
            other,
            "" if other else "you requested this promotion: another approver must decide it",
        ),
    ]


def _refuse_decider(checks: list[Precondition]) -> None:
    """Not an approver, or the requester: a matter of who may act (403), not of state."""
    for check in checks:
        if not check.ok:
            raise PermissionDenied(check.detail)


def promotion_approve_check(*, promotion: PromotionRequest, user=None) -> list[Precondition]:
    """Everything approval needs, each with whether it holds now. Without `user`, the
    checks that do not depend on who approves."""
    live = live_version_get(deployment_id=promotion.deployment_id)
    pending = promotion.status == PromotionStatus.PENDING
    checks = [
        Precondition(
            "pending",
            "Waiting for a decision",
            pending,
            "" if pending else f"request {promotion.pk} is {promotion.get_status_display().lower()}",
            "status",
        ),
        _not_live(promotion.candidate, live),
        _deployable(promotion.candidate),
        _evaluation_finished(promotion.evaluation, promotion.candidate, promotion.deployment),
        _evaluation_current(promotion.evaluation, live),
        _monitors(promotion.candidate, promotion.breach_override_reason),
        _lineage(promotion.candidate, live, promotion.rebase_reason),
        _no_release_running(promotion.deployment),
    ]
    return (_decider(promotion, user) if user is not None else []) + checks


def _locked(promotion: PromotionRequest) -> PromotionRequest:
    return (
        PromotionRequest.objects.select_for_update(of=("self",))
        .select_related("candidate__base_model", "deployment", "evaluation__baseline", "from_version", "requested_by")
        .get(pk=promotion.pk)
    )


@transaction.atomic
def promotion_approve(*, promotion: PromotionRequest, user, comment: str = "") -> Release:
    """Approve and queue the release. Raises PermissionDenied (not an approver, or the
    requester) or PromotionRefused (a precondition that does not hold)."""
    from training.services.release import release_queue, releases_fail_stale

    promotion = _locked(promotion)
    checks = promotion_approve_check(promotion=promotion, user=user)
    _refuse_decider(checks[:2])
    releases_fail_stale(deployment=promotion.deployment)
    _raise_first(checks)
    live = live_version_get(deployment_id=promotion.deployment_id)
    promotion.status = PromotionStatus.APPROVED
    promotion.decided_by = user
    promotion.decided_at = timezone.now()
    promotion.decision_comment = comment
    promotion.decision_snapshot = _snapshot(promotion.candidate, promotion.deployment, promotion.evaluation)
    promotion.save(update_fields=["status", "decided_by", "decided_at", "decision_comment", "decision_snapshot"])
    audit_record(
        action=AuditAction.PROMOTION_APPROVED,
        deployment=promotion.deployment,
        actor=user,
        from_version=live,
        to_version=promotion.candidate,
        evaluation=promotion.evaluation,
        promotion=promotion,
        detail=comment,
    )
    return release_queue(
        deployment=promotion.deployment,
        version=promotion.candidate,
        kind="promotion",
        promotion=promotion,
        user=user,
        reason=f"promotion {promotion.pk}",
    )


@transaction.atomic
def promotion_reject(*, promotion: PromotionRequest, user, comment: str) -> PromotionRequest:
    """Reject with a comment (required: the requester needs to know why)."""
    promotion = _locked(promotion)
    _refuse_decider(_decider(promotion, user))
    if promotion.status != PromotionStatus.PENDING:
        raise PromotionRefused(f"request {promotion.pk} is {promotion.get_status_display().lower()}", field="status")
    if not comment.strip():
        raise PromotionRefused("say why the request is rejected", field="comment")
    promotion.status = PromotionStatus.REJECTED
    promotion.decided_by = user
    promotion.decided_at = timezone.now()
    promotion.decision_comment = comment.strip()
    promotion.decision_snapshot = _snapshot(promotion.candidate, promotion.deployment, promotion.evaluation)
    promotion.save(update_fields=["status", "decided_by", "decided_at", "decision_comment", "decision_snapshot"])
    audit_record(
        action=AuditAction.PROMOTION_REJECTED,
        deployment=promotion.deployment,
        actor=user,
        from_version=promotion.from_version,
        to_version=promotion.candidate,
        evaluation=promotion.evaluation,
        promotion=promotion,
        detail=comment.strip(),
    )
    return promotion
