"""Promotion requests: asked for by one person, approved or rejected by another.

Check-then-execute: `promotion_request_check` / `promotion_approve_check` return every
precondition with whether it holds (the request page lists them) and the `*_execute`
functions raise `PromotionRefused` naming the first unmet one before changing anything.
Approval queues a release (see `training.promotion.services.release`) after commit. The pages ask
the approver to confirm what approval does first (`promotion_approval_effect`); a call to
the API's approve is that confirmation itself, refused for the same preconditions.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.utils import timezone

from training.promotion.models import AuditAction, Evaluation, PromotionRequest, PromotionStatus, Release
from training.promotion.rollout_models import ReleasePlan
from training.promotion.services.four_eyes import check_independent
from training.promotion.services.promotion_checks import (
    REQUEST,
    Precondition,
    PromotionRefused,
    check_deployable,
    check_evaluation_current,
    check_evaluation_finished,
    check_harm,
    check_lineage,
    check_monitors,
    check_no_release_running,
    check_not_live,
    check_not_withdrawn_since,
    check_regressions,
    raise_first_unmet,
    snapshot,
)
from training.promotion.services.promotion_refused import APPROVE
from training.promotion.services.release import release_queue, releases_fail_stale
from training.promotion.services.rollouts import rollout_create
from training.services.audit import audit_record
from training.serving.models import Deployment, ModelVersion
from training.serving.selectors import live_version_get
from webapp.kernel.work import WorkStatus

# Request -------------------------------------------------------------------------------


def promotion_request_check(
    *,
    candidate: ModelVersion,
    deployment: Deployment,
    evaluation: Evaluation | None,
    breach_override_reason: str = "",
    rebase_reason: str = "",
    regression_override_reason: str = "",
) -> list[Precondition]:
    live = live_version_get(deployment_id=deployment.pk)
    checks = [check_not_live(candidate, live), check_deployable(candidate)]
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
        checks.append(check_evaluation_finished(evaluation, candidate, deployment))
    elif evaluation.status in (WorkStatus.FAILED, WorkStatus.CANCELLED):
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
        checks.append(check_harm(evaluation))
        checks.append(check_regressions(candidate, evaluation, regression_override_reason))
    checks += [check_monitors(candidate, breach_override_reason), check_lineage(candidate, live, rebase_reason)]
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
    regression_override_reason: str = "",
) -> PromotionRequest:
    """Ask for `candidate` to go live for `deployment`. The evaluation may still be running:
    approval waits for it. Snapshots the monitors and the judge's agreement as they are now."""
    if not requested_by.has_perm(REQUEST):
        raise PermissionDenied(f"your role does not include {REQUEST}")
    raise_first_unmet(
        promotion_request_check(
            candidate=candidate,
            deployment=deployment,
            evaluation=evaluation,
            breach_override_reason=breach_override_reason,
            rebase_reason=rebase_reason,
            regression_override_reason=regression_override_reason,
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
                regression_override_reason=regression_override_reason.strip(),
                snapshot=snapshot(candidate, deployment, evaluation),
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
            for k, v in {
                "breach_override_reason": breach_override_reason,
                "rebase_reason": rebase_reason,
                "regression_override_reason": regression_override_reason,
            }.items()
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


def _storable_comment(comment: str) -> None:
    # PostgreSQL text cannot hold NUL: refuse it as bad input (400) instead of failing the write.
    if "\x00" in comment:
        raise PromotionRefused("contains a NUL character", field="comment")


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
        check_not_live(promotion.candidate, live),
        check_deployable(promotion.candidate),
        check_evaluation_finished(promotion.evaluation, promotion.candidate, promotion.deployment),
        check_evaluation_current(promotion.evaluation, live),
        check_harm(promotion.evaluation),
        check_regressions(
            promotion.candidate,
            promotion.evaluation,
            promotion.regression_override_reason,
            overridden_by=promotion.requested_by.username if promotion.requested_by_id else "",
        ),
        check_monitors(promotion.candidate, promotion.breach_override_reason),
        check_lineage(promotion.candidate, live, promotion.rebase_reason),
        check_not_withdrawn_since(promotion),
        check_no_release_running(promotion.deployment),
    ]
    if user is None:
        return checks
    return [*_decider(promotion, user), check_independent(promotion, user), *checks]


@dataclass(frozen=True)
class ApprovalEffect:
    """What approving a request does, for the confirmation the pages ask for first. The
    gateway routes a deployment's every request to its live version: a release moves all of
    its traffic at once, and the version it replaces stays loaded as the rollback target."""

    deployment: Deployment
    candidate: ModelVersion
    replaces: ModelVersion | None
    traffic_share: float
    token: str  # names this effect: a confirmation of another (the live version moved since) is stale
    plan: ReleasePlan | None = None  # a progressive release's plan: `traffic_share` is its first step's


def promotion_approval_effect(*, promotion: PromotionRequest, plan: ReleasePlan | None = None) -> ApprovalEffect:
    """With a progressive `plan` the candidate first takes its first step's share."""
    live = live_version_get(deployment_id=promotion.deployment_id)
    token = f"{promotion.pk}:{promotion.deployment_id}:{promotion.candidate_id}:{live.pk if live else 0}"
    progressive = plan is not None and live is not None and plan.steps[0]["share"] < 1
    return ApprovalEffect(
        deployment=promotion.deployment,
        candidate=promotion.candidate,
        replaces=live,
        traffic_share=float(plan.steps[0]["share"]) if progressive else 1.0,
        token=token + (f":plan{plan.pk}" if progressive else ""),
        plan=plan if progressive else None,
    )


def promotion_approve_refusal(*, promotion: PromotionRequest, user) -> None:
    """Raise what `promotion_approve` would raise now, and change nothing: a confirmation is
    asked for only what can be approved."""
    checks = promotion_approve_check(promotion=promotion, user=user)
    _refuse_decider(checks[:2])
    raise_first_unmet(checks)


def _locked(promotion: PromotionRequest) -> PromotionRequest:
    return (
        PromotionRequest.objects.select_for_update(of=("self",))
        .select_related("candidate__base_model", "deployment", "evaluation__baseline", "from_version", "requested_by")
        .get(pk=promotion.pk)
    )


@transaction.atomic
def promotion_approve(
    *, promotion: PromotionRequest, user, comment: str = "", plan: ReleasePlan | None = None
) -> Release:
    """Approve and queue the release. Raises PermissionDenied (not an approver, or the
    requester) or PromotionRefused (a precondition that does not hold). With a `plan` whose
    first step is a share of the traffic, the release starts a progressive release
    (`training.promotion.services.rollouts`) instead of taking all traffic at once."""

    promotion = _locked(promotion)
    checks = promotion_approve_check(promotion=promotion, user=user)
    _refuse_decider(checks[:2])
    _storable_comment(comment)
    releases_fail_stale()
    raise_first_unmet(checks)
    live = live_version_get(deployment_id=promotion.deployment_id)
    progressive = plan is not None and plan.steps[0]["share"] < 1
    if progressive and live is None:
        raise PromotionRefused(
            f"{promotion.deployment.name} has no live version to share its traffic with: approve all at once",
            field="plan",
        )
    promotion.status = PromotionStatus.APPROVED
    promotion.decided_by = user
    promotion.decided_at = timezone.now()
    promotion.decision_comment = comment
    promotion.decision_snapshot = snapshot(promotion.candidate, promotion.deployment, promotion.evaluation)
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
    release = release_queue(
        deployment=promotion.deployment,
        version=promotion.candidate,
        kind="promotion",
        promotion=promotion,
        user=user,
        reason=f"promotion {promotion.pk}" + (f", plan {plan.name}" if plan is not None else ""),
    )
    if progressive:
        rollout_create(promotion=promotion, release=release, plan=plan, user=user)
    return release


@transaction.atomic
def promotion_reject(*, promotion: PromotionRequest, user, comment: str) -> PromotionRequest:
    """Reject with a comment (required: the requester needs to know why)."""
    promotion = _locked(promotion)
    _refuse_decider(_decider(promotion, user))
    if promotion.status != PromotionStatus.PENDING:
        raise PromotionRefused(f"request {promotion.pk} is {promotion.get_status_display().lower()}", field="status")
    if not comment.strip():
        raise PromotionRefused("say why the request is rejected", field="comment")
    _storable_comment(comment)
    promotion.status = PromotionStatus.REJECTED
    promotion.decided_by = user
    promotion.decided_at = timezone.now()
    promotion.decision_comment = comment.strip()
    promotion.decision_snapshot = snapshot(promotion.candidate, promotion.deployment, promotion.evaluation)
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
