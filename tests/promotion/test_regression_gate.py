"""The regression gate: every signal side by side with the live version, with its 95%
interval; a signal worse than its threshold blocks the request unless the requester gives a
reason, which is audited with their name and shown to the approver."""

from __future__ import annotations

import math

import pytest

from tests.promotion.conftest import evaluation_row
from training.promotion.models import AuditAction, AuditEvent
from training.promotion.services.promotion import promotion_approve_check, promotion_request_create
from training.promotion.services.promotion_checks import PromotionRefused
from training.promotion.services.promotion_signals import Signal, difference_interval


def regressing_job(registry, *, curve=((0, 0.217), (10, 0.15), (20, 0.067)), n=60):
    """The producing job of the registry's candidate, whose own held-out success fell."""
    from training.models import JobEventKind, TrainingJob, TrainingJobEvent

    job = TrainingJob.objects.create(
        kind="sft", status="finished", config={}, base_version=registry.base_version, result_version=registry.candidate
    )
    for step, success in curve:
        TrainingJobEvent.objects.create(
            job=job, kind=JobEventKind.EVAL, step=step, data={"step": step, "success": success, "n": n}
        )
    return job


def glowing_evaluation(registry):
    """An evaluation that says the opposite: the candidate wins most items."""
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version, total=20)
    evaluation.summary = {
        "comparison": {"win_rate": 0.6, "ci_low": 0.39, "ci_high": 0.78, "n": 20},
        "candidate": {},
        "baseline": {},
    }
    evaluation.save(update_fields=["summary"])
    return evaluation


def test_difference_interval_matches_a_hand_computation():
    # Newcombe's hybrid score interval for a = 4/60, b = 13/60. Wilson 95%: a in
    # [0.02623, 0.15925], b in [0.13123, 0.33620]; d = -0.15;
    # L = d - sqrt((0.06667 - 0.02623)^2 + (0.33620 - 0.21667)^2) = -0.15 - 0.12619 = -0.27619,
    # U = d + sqrt((0.15925 - 0.06667)^2 + (0.21667 - 0.13123)^2) = -0.15 + 0.12598 = -0.02402.
    low, high = difference_interval(4 / 60, 60, 13 / 60, 60)
    assert (round(low, 4), round(high, 4)) == (-0.2762, -0.0240)
    assert difference_interval(0.5, 0, 0.5, 10) == (None, None)


def test_a_signal_regresses_only_in_its_own_worse_direction_beyond_its_threshold():
    worse = Signal("x", "x", "", 0.1, 0.2, -0.1, threshold=0.05)
    assert (worse.direction, worse.regressed) == ("worse", True)
    assert not Signal("x", "x", "", 0.17, 0.2, -0.03, threshold=0.05).regressed  # within the threshold
    lower_is_better = Signal("c", "c", "", 0.0, 0.2, -0.2, higher_is_better=False, threshold=0.0)
    assert (lower_is_better.direction, lower_is_better.regressed) == ("better", False)


def test_the_mean_reward_difference_carries_its_interval():
    from training.promotion.evaluation.metrics import summarize

    def side(reward):
        return {"reward": reward}

    items = [{"candidate": side(c), "baseline": side(b), "outcome": ""} for c, b in ((1, 0), (0.5, 0.5), (0, 0.5))]
    c = summarize(items)["comparison"]
    diffs = [1.0, 0.0, -0.5]
    mean = sum(diffs) / 3
    s = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    assert math.isclose(c["reward_diff_ci_low"], mean - 1.959963984540054 * s / math.sqrt(3))


def test_a_regressing_job_blocks_the_request_until_an_audited_override(registry, operator, approver):
    regressing_job(registry)
    evaluation = glowing_evaluation(registry)
    with pytest.raises(PromotionRefused) as refused:
        promotion_request_create(
            candidate=registry.candidate, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
        )
    assert refused.value.code == "regression" and refused.value.field == "regression_override_reason"
    assert str(refused.value).startswith("Job's held-out success: 0.217 → 0.067 (Δ -0.150, 95% CI [-0.276, -0.024]")

    promotion = promotion_request_create(
        candidate=registry.candidate,
        deployment=registry.deployment,
        evaluation=evaluation,
        requested_by=operator,
        regression_override_reason="the held-out split of that job was mislabelled",
    )
    requested = AuditEvent.objects.get(action=AuditAction.PROMOTION_REQUESTED)
    assert requested.actor_id == operator.pk
    assert requested.data == {"regression_override_reason": "the held-out split of that job was mislabelled"}
    signals = {s["code"]: s for s in promotion.snapshot["signals"]}
    assert signals["job_heldout"]["regressed"] and signals["job_heldout"]["direction"] == "worse"
    assert signals["win_rate"]["direction"] == "better" and not signals["win_rate"]["regressed"]
    check = next(c for c in promotion_approve_check(promotion=promotion, user=approver) if c.code == "regression")
    assert check.ok
    assert check.detail.startswith("regression overridden by olga: the held-out split of that job was mislabelled")


def test_without_a_regression_the_gate_says_so(registry, operator):
    regressing_job(registry, curve=((0, 0.2), (10, 0.18)))  # within 0.05
    promotion = promotion_request_create(
        candidate=registry.candidate,
        deployment=registry.deployment,
        evaluation=glowing_evaluation(registry),
        requested_by=operator,
    )
    assert promotion.pk
