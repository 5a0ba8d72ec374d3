"""The approver's page in Chromium, on evaluations stored as the measurement writes them
(tests/promotion/evidence.py):

- the demo's small evaluation (3 traces whose answers were all empty, 6 episodes) reads
  "inconclusive" where n is small and "not measured" where the judge scored nothing, with the
  verdict above the evidence and the evidence above the buttons; approval goes through a
  confirmation page that says what it does;
- a candidate that learned "refund every delivered order" has its promotion request blocked
  by the policy-violation check, with the reason on the approver's page and the notification
  page: the harm precondition counts policy violations (`harm_precondition.HARM_SIGNALS`)."""

from __future__ import annotations

import pytest

from tests.factories import user_with_role
from tests.promotion.conftest import registry  # noqa: F401 - the fixture
from tests.promotion.evidence import (
    ENVIRONMENT,
    REFUND_GAIN,
    demo_like_items,
    evaluation_finish,
    evaluation_store,
    refund_curve,
    refund_everything_items,
)
from training.promotion.models import PromotionStatus, Release

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def below(page, upper: str, lower: str) -> bool:
    """Whether `lower` starts below where `upper` starts on the page."""
    return page.locator(upper).bounding_box()["y"] < page.locator(lower).bounding_box()["y"]


def test_the_demos_evaluation_reads_inconclusive_above_the_buttons_and_approval_is_confirmed(
    open_page,
    screenshot,
    registry,  # noqa: F811
):
    from feedback.models import DeploymentJudge
    from training.promotion.services.promotion import promotion_request_create

    operator, approver = user_with_role("operator", "olga"), user_with_role("approver", "arno")
    DeploymentJudge.objects.create(deployment=registry.deployment, base_url="http://127.0.0.1:9/v1", model="judge")
    config = {"generator": "vllm", "max_tokens": 16, "temperature": 0.0, "judge": {"model": "judge"}}
    evaluation = evaluation_store(
        registry.candidate,
        registry.deployment,
        registry.base_version,
        demo_like_items(),
        sources=ENVIRONMENT,
        config=config,
    )
    promotion = promotion_request_create(
        candidate=registry.candidate,
        deployment=registry.deployment,
        evaluation=evaluation,
        requested_by=operator,
        note="Refunds look better on the tour's traces.",
    )

    page = open_page(approver)
    page.goto(f"/promotions/{promotion.pk}/")
    verdict = page.locator("#verdict")
    assert verdict.get_attribute("data-level") == "caution"
    assert below(page, "#verdict", "#signals") and below(page, "#signals", "#approve")
    assert below(page, "#verdict-flags", "#approve")  # the red flags are read before the buttons
    assert "n 9" in page.inner_text("#verdict-inconclusive") and "Evaluation win rate" in verdict.inner_text()
    assert "Mean judge reward: not measured" in page.inner_text("#verdict-unmeasured")
    assert "Judge agreement: gate blocked" in page.inner_text("#verdict-unverified")
    flags = page.inner_text("#verdict-flags")
    assert "Empty answers 33 % (live 33 %)" in flags and "Cut off at the token limit 33 %" in flags
    win = page.locator("#signal-win_rate")
    assert win.get_attribute("data-status") == "inconclusive" and win.locator("td.better").count() == 0
    assert "inconclusive" in win.inner_text() and "spans the threshold" in win.inner_text()
    judged = page.locator("#signal-reward_diff")
    assert judged.get_attribute("data-status") == "not measured" and "0.000" not in judged.inner_text()
    assert page.locator("#signals td.better").count() == 0  # nothing here is better beyond noise
    assert "!" in page.inner_text("li[data-code='regression'] .mark")
    screenshot(page, "approver-verdict", full_page=True)

    # Approve: first the page that says what approving does; nothing changes on it.
    page.fill("#decision textarea[name=comment]", "Small, but nothing regressed.")
    page.click("#approve")
    page.wait_for_selector("#confirm-approve")
    assert page.url.endswith(f"/promotions/{promotion.pk}/approve")
    effect = page.inner_text("#confirm")
    assert "support-bot" in effect and "100 %" in effect and "replacing smol" in effect
    assert "Roll back to smol" in effect and "stays loaded" in effect
    assert page.input_value("#confirm textarea[name=comment]") == "Small, but nothing regressed."
    assert below(page, "#verdict", "#confirm-approve")
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.PENDING and not Release.objects.exists()
    screenshot(page, "approval-confirmation", full_page=True)

    page.click("#confirm-approve")
    page.wait_for_selector("#promotion-status:has-text('Approved')")
    promotion.refresh_from_db()
    assert (promotion.status, promotion.decided_by, promotion.decision_comment) == (
        PromotionStatus.APPROVED,
        approver,
        "Small, but nothing regressed.",
    )
    assert Release.objects.filter(promotion=promotion).count() == 1


def test_a_refund_everything_candidate_is_blocked_by_the_policy_violation_check(
    open_page,
    screenshot,
    registry,  # noqa: F811
):
    from training.promotion.services.promotion import promotion_request_create

    operator, approver = user_with_role("operator", "olga"), user_with_role("approver", "arno")
    items = refund_everything_items()
    evaluation = evaluation_store(
        registry.candidate, registry.deployment, registry.base_version, items, status="running", sources=ENVIRONMENT
    )
    # Asked for while the evaluation runs (approval waits for it); then its figures come in.
    promotion = promotion_request_create(
        candidate=registry.candidate,
        deployment=registry.deployment,
        evaluation=evaluation,
        requested_by=operator,
        note="Success 0.542 → 0.674 on the test split.",
    )
    evaluation_finish(evaluation, items, extra={"gain": REFUND_GAIN, "decision_curve": refund_curve()})

    page = open_page(approver)
    page.goto(f"/promotions/{promotion.pk}/")
    harm = page.locator("#decision li[data-code='harm']")
    reason = harm.inner_text()
    assert "✗" in reason and "blocked whatever the success rate" in reason
    assert "31 of 144 episodes" in reason and "the live version in 2 of 144 episodes" in reason
    assert page.locator("#approve").is_disabled()
    # The verdict says it first, above the evidence and the buttons.
    assert page.locator("#verdict").get_attribute("data-level") == "blocked"
    assert "31 of 144 episodes" in page.inner_text("#verdict-blocked")
    assert below(page, "#verdict", "#signals") and below(page, "#signals", "#approve")
    assert page.locator("#signal-violations").get_attribute("data-status") == "regressed"
    assert page.locator("#kind-kind_success-late_near_line").get_attribute("data-status") == "regressed"
    screenshot(page, "promotion-blocked-by-violations", full_page=True)

    # Approving anyway (the form posted without the page's help) is refused with the reason.
    page.evaluate("() => { const b = document.querySelector('#approve'); b.disabled = false; b.click(); }")
    page.wait_for_load_state()
    assert "blocked whatever the success rate" in page.inner_text(".flash")
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.PENDING and not Release.objects.exists()

    # The notification page's card says the same in its verdict.
    page.goto("/notifications/")
    card = page.locator(f"#promotion-{promotion.pk}")
    assert "31 of 144 episodes" in card.locator(f"#verdict-{promotion.pk}-blocked").inner_text()


def test_the_evaluation_page_draws_the_decision_curve_beside_success_by_kind(
    open_page,
    screenshot,
    registry,  # noqa: F811
):
    operator = user_with_role("operator", "olga")
    evaluation = evaluation_store(
        registry.candidate,
        registry.deployment,
        registry.base_version,
        refund_everything_items(),
        sources=ENVIRONMENT,
        extra={"gain": REFUND_GAIN, "decision_curve": refund_curve()},
    )
    page = open_page(operator)
    page.goto(f"/evaluations/{evaluation.pk}/")
    curve = page.locator("#decision-curve svg")
    assert curve.count() == 1 and curve.locator("polyline").count() == 2
    assert "rule: 30" in curve.text_content()
    kinds = page.locator("#by-kind tbody tr")
    assert kinds.count() == 5
    assert page.locator("#by-kind tr[data-status='regressed']").count() == 2  # both late kinds
    assert "+0.132" in page.inner_text("#episode-gain")
    page.click("#decision-curve summary")
    assert "days since delivery" in page.inner_text("#decision-curve table")
    screenshot(page, "evaluation-by-kind-and-decision-curve", element=page.locator("#report .evaluation-summary"))
