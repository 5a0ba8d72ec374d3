"""What waits for a person: every promotion request still pending that they may decide.

An approver (`training.approve_promotion`) may decide any pending request but their own (the
four-eyes rule the promotion service enforces), whether a learning policy or a person opened
it; anyone else has nothing to decide. The evidence shown with each request is read from what
the request recorded (its snapshot: the policy's run, the job's signals, the monitors, the
judge's agreement) and its evaluation's summary (the evaluation's signals, worked out again:
the request may have been made while it ran), so the page costs the same few queries however
many requests wait. Each card opens with the same verdict as the request's page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db.models import Q, QuerySet
from django.utils import timezone

from training.promotion.models import PromotionRequest, PromotionStatus
from training.promotion.rollout_models import ACTIVE_STATES, Rollout, RolloutState
from training.promotion.selectors import evaluation_items_source
from training.promotion.services.promotion_checks import Precondition, check_harm
from training.promotion.services.promotion_refused import APPROVE
from training.promotion.services.promotion_signals import Signal, evaluation_signals, signal_from_dict
from training.promotion.services.promotion_verdict import Verdict, promotion_overrides, promotion_verdict
from webapp.kernel.work import WorkStatus

MAX_SHOWN = 50

# What a card reads of each request, joined in its one query.
AWAITING_JOINS = (
    "candidate",
    "deployment",
    "from_version",
    "requested_by",
    "evaluation__baseline",
    "evaluation__training_set",
)


@dataclass
class AwaitingDecision:
    """A pending request and the evidence an approver decides it on."""

    promotion: PromotionRequest
    policy: dict[str, Any] | None  # the learning policy's run that opened it, as recorded
    evaluation_finished: bool
    win_rate: float | None
    ci_low: float | None
    ci_high: float | None
    n: int
    measured_on: str
    harm: Precondition
    regressions: list[dict[str, Any]] = field(default_factory=list)  # signals past their threshold, as recorded
    breaches: list[dict[str, Any]] = field(default_factory=list)
    verdict: Verdict | None = None


def _may_decide(user) -> bool:
    return bool(user is not None and user.is_authenticated and user.is_active and user.has_perm(APPROVE))


def _waiting(user) -> QuerySet[PromotionRequest]:
    return PromotionRequest.objects.filter(status=PromotionStatus.PENDING).exclude(requested_by=user)


def promotions_awaiting_count(*, user) -> int:
    """How many requests wait for `user`'s decision: one COUNT for an approver, no query for
    anyone else."""
    return _waiting(user).count() if _may_decide(user) else 0


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _signals(promotion: PromotionRequest, snapshot: dict[str, Any]) -> list[Signal]:
    """The job's signals as the request recorded them, the evaluation's from its summary now."""
    recorded = [signal_from_dict(s) for s in snapshot.get("signals") or [] if isinstance(s, dict)]
    return [s for s in recorded if s.code.startswith("job_")] + evaluation_signals(promotion.evaluation)


def awaiting_decision(promotion: PromotionRequest) -> AwaitingDecision:
    """The evidence of one request (no query: its evaluation and people are joined)."""
    evaluation = promotion.evaluation
    comparison = (evaluation.summary or {}).get("comparison") or {}
    snapshot = promotion.snapshot or {}
    monitors = snapshot.get("monitors") or {}
    harm = check_harm(evaluation)
    signals = _signals(promotion, snapshot)
    breaches = [b for b in monitors.get("breaches") or [] if isinstance(b, dict)]
    return AwaitingDecision(
        promotion=promotion,
        policy=snapshot.get("learning_policy") if isinstance(snapshot.get("learning_policy"), dict) else None,
        evaluation_finished=evaluation.status == WorkStatus.FINISHED,
        win_rate=_number(comparison.get("win_rate")),
        ci_low=_number(comparison.get("ci_low")),
        ci_high=_number(comparison.get("ci_high")),
        n=int(_number(comparison.get("n")) or 0),
        measured_on=evaluation_items_source(evaluation=evaluation),
        harm=harm,
        regressions=[s.as_dict() for s in signals if s.regressed and s.gates],
        breaches=breaches,
        verdict=promotion_verdict(
            signals=signals,
            evaluation=evaluation,
            harm=harm,
            judge_agreement=snapshot.get("judge_agreement"),
            overrides=promotion_overrides(promotion),
            breaches=breaches,
        ),
    )


def promotions_awaiting(*, user, limit: int = MAX_SHOWN) -> list[AwaitingDecision]:
    """The requests waiting for `user`'s decision, oldest first (one query), each with its
    evidence; none for someone who may not decide."""
    if not _may_decide(user):
        return []
    rows = _waiting(user).select_related(*AWAITING_JOINS).order_by("requested_at", "id")[:limit]
    return [awaiting_decision(p) for p in rows]


def promotion_decided_get(*, promotion_id: int) -> PromotionRequest | None:
    """A request as it stands after a decision, with what the notification shows of it."""
    return (
        PromotionRequest.objects.select_related("candidate", "deployment", "decided_by", "requested_by")
        .filter(pk=promotion_id)
        .first()
    )


RELEASE_NEWS_DAYS = 7


def rollouts_needing_attention(*, user) -> list:
    """For an approver: progressive releases under way, and those the automatic check rolled
    back in the last week (with the reason it wrote), newest first."""
    if not _may_decide(user):
        return []
    since = timezone.now() - timedelta(days=RELEASE_NEWS_DAYS)
    # The rollback change itself by the check: one filter() call, so both conditions read the
    # same change (the start of every rollout is recorded as automatic too).
    rolled_back = Q(
        state=RolloutState.ROLLED_BACK,
        ended_at__gte=since,
        changes__to_state=RolloutState.ROLLED_BACK,
        changes__actor__isnull=True,
    )
    return list(
        Rollout.objects.filter(Q(state__in=ACTIVE_STATES) | rolled_back)
        .select_related("deployment", "candidate", "baseline")
        .distinct()
        .order_by("-started_at")[:MAX_SHOWN]
    )
