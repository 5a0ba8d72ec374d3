"""The approver's page in Chromium for a candidate that learned its training order by heart
(see tests/promotion/test_harm_gate.py): the promotion was requested while the evaluation
ran; once it finishes, the page shows the collateral / unknown-id check failing with its
reason beside the success rates, and approval is refused."""

from __future__ import annotations

import pytest

from tests.factories import user_with_role
from tests.promotion.test_harm_gate import HELD_OUT_TASKS, harmful_evaluation_create
from training.promotion.models import PromotionStatus
from webapp.kernel.work import WorkStatus

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.slow]


def test_the_approver_sees_the_harm_and_cannot_approve(open_page, screenshot, memorising_registry):
    from training.promotion.services.evaluation import evaluation_run
    from training.promotion.services.promotion import promotion_request_create

    deployment, _, candidate, order_id = memorising_registry
    operator, approver = user_with_role("operator", "olga"), user_with_role("approver", "arno")
    evaluation = harmful_evaluation_create(deployment, candidate, operator)
    # Asked for while the evaluation runs (approval waits for it).
    promotion = promotion_request_create(
        candidate=candidate, deployment=deployment, evaluation=evaluation, requested_by=operator, note="ship it"
    )
    evaluation = evaluation_run(evaluation_id=evaluation.pk)
    assert evaluation.status == WorkStatus.FINISHED, evaluation.error

    page = open_page(approver)
    page.goto(f"/promotions/{promotion.pk}/")
    harm = page.locator("#decision li[data-code='harm']")
    assert "✗" in harm.inner_text()
    reason = harm.inner_text()
    assert "blocked whatever the success rate" in reason
    assert f"of {HELD_OUT_TASKS} episodes" in reason and "the live version in 0 of" in reason
    assert page.locator("#approve").is_disabled()
    # Beside success, on the same page: the rates and the verdict.
    assert "Blocks promotion" in page.inner_text("#harm-verdict")
    assert page.locator("#episode-success").count() == 1
    for row in ("#episode-collateral", "#episode-unknown-ids"):
        assert "0/6" in page.inner_text(row)  # the live version's
    screenshot(page, "promotion-blocked-by-harm", full_page=True)

    # Approving anyway (the form posted without the page's help) is refused with the reason.
    page.evaluate("() => { const b = document.querySelector('#approve'); b.disabled = false; b.click(); }")
    page.wait_for_load_state()
    assert "blocked whatever the success rate" in page.inner_text("body")
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.PENDING

    # The evaluation page says the same beside the success rate.
    page.goto(f"/evaluations/{evaluation.pk}/")
    assert "Blocks promotion" in page.inner_text("#harm-verdict")
    assert order_id not in page.inner_text("#episode-success")
    # Each episode's page names what its audit found.
    item = next(i for i in evaluation.items.order_by("position") if i.candidate["unknown_ids"])
    page.goto(f"/evaluations/{evaluation.pk}/items/{item.position}/")
    assert item.candidate["unknown_ids"][0] in page.inner_text("#candidate-response")
