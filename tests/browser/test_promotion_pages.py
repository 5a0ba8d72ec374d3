"""Promotion in real headless Chromium, with the real worker and vLLM server behind it: an
operator requests a promotion, an approver approves it, and the release status on the
page moves through its steps to Live without a reload."""

from __future__ import annotations

import time

import pytest

from tests.factories import DeploymentFactory, user_with_role
from tests.fixtures.adapters import LOOKUP_TOOL
from tests.fixtures.inference import talking_version_create
from tests.fixtures.judge import scores_lookups
from training.promotion.models import PromotionRequest
from training.serving.models import LiveVersion
from webapp.kernel.work import WorkStatus

pytestmark = [pytest.mark.browser, pytest.mark.vllm, pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]

ITEMS = [
    {
        "key": "order-status",
        "messages": [{"role": "user", "content": "Where is my order A1001?"}],
        "tools": [LOOKUP_TOOL],
    },
    {"key": "refund", "messages": [{"role": "user", "content": "Refund please"}], "tools": [LOOKUP_TOOL]},
    {
        "key": "<b>greeting</b>",
        "messages": [{"role": "user", "content": "hello <script>x()</script>"}],
        "grader": "contains",
        "reference": "lookup_order",
    },
]


def test_request_approve_and_watch_the_release_go_live(
    open_page,
    screenshot,
    vllm_server,
    tiny_base,
    tool_call_adapter_path,
    talking_adapter_path,
    deploy_worker,
    judge_server,
):
    from feedback.models import DeploymentJudge
    from training.promotion.services.evaluation import evaluation_create
    from training.serving.services import live_version_set, model_version_create

    operator, approver = user_with_role("operator", "olga"), user_with_role("approver", "arno")
    deployment = DeploymentFactory(name="support-bot")
    # Live before: the talking adapter, which a rollback can put live again (the random tiny
    # model itself answers only newlines, which the release's smoke test refuses).
    base_version = talking_version_create(tiny_base, talking_adapter_path, vllm_server)
    live_version_set(deployment=deployment, version=base_version)
    DeploymentJudge.objects.create(deployment=deployment, base_url=judge_server.base_url, model="test-judge")
    judge_server.respond_with(scores_lookups)
    candidate = model_version_create(
        name="tiny-tools-v2", base_model=tiny_base, kind="lora", path=tool_call_adapter_path, parent=base_version
    )
    evaluation = evaluation_create(
        candidate=candidate, deployment=deployment, items=ITEMS, created_by=operator, max_tokens=40
    )

    # The operator watches the evaluation report fill in, then asks for the promotion.
    page = open_page(operator)
    page.goto(f"/evaluations/{evaluation.pk}/")
    page.wait_for_selector("#evaluation-status:has-text('Finished')", timeout=120_000)
    evaluation.refresh_from_db()
    assert evaluation.status == WorkStatus.FINISHED
    assert "100.0%" in page.inner_text("#win-rate")
    screenshot(page, "evaluation-report", full_page=True)
    page.click("a:has-text('order-status')")
    assert page.inner_text("#candidate-response").count("lookup_order") >= 1
    assert "<b>greeting</b>" not in page.content()
    page.goto(f"/evaluations/{evaluation.pk}/items/0/")
    screenshot(page, "evaluation-item")
    page.goto(f"/evaluations/{evaluation.pk}/")
    page.click("text=Request promotion →")
    page.fill("#id_note", "Looks the order up instead of guessing.")
    page.click("button:has-text('Request promotion')")
    page.wait_for_selector("#promotion-status:has-text('Waiting for approval')")
    promotion = PromotionRequest.objects.get()
    assert page.locator("#approve").count() == 0  # not for the requester

    # The approver approves; the release section updates in place until the version is live.
    review = open_page(approver)
    review.goto(f"/promotions/{promotion.pk}/")
    assert "✓" in review.inner_text("#decision")
    review.fill("textarea[name=comment]", "Win rate and tool calls look right.")
    review.click("#approve")
    review.click("#confirm-approve")  # after reading what approving does
    review.wait_for_selector("#release-status")
    review.evaluate("window.__same_page = true")
    seen = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = review.inner_text("#release-status")
        if not seen or seen[-1] != status:
            seen.append(status)
        if status in ("Live", "Failed"):
            break
        time.sleep(0.05)
    assert seen[-1] == "Live", seen
    assert review.evaluate("window.__same_page") is True  # htmx swapped it; no reload
    assert review.inner_text("#promotion-status") == "Deployed"
    assert LiveVersion.objects.get(deployment=deployment).version == candidate
    screenshot(review, "promotion-request", full_page=True)

    # The rollback button is on the same page.
    review.fill("input[name=reason]", "checking the way back")
    review.click("#rollback")
    review.wait_for_selector("#promotion-status:has-text('Rolled back')", timeout=60_000)
    assert LiveVersion.objects.get(deployment=deployment).version == base_version
    review.goto("/audit/")
    # The steps, and the pointer's three moves: the base going live, the release, the rollback.
    assert review.locator("table.audit tbody tr").count() == 12
    moves = review.locator("table.audit tbody tr:has-text('Live version switched')")
    assert moves.count() == 3 and "Live version switched · Rollback" in moves.first.inner_text()
    screenshot(review, "audit-log")
