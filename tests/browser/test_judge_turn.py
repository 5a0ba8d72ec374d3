"""'Judge this turn' in real headless Chromium: the result arrives in place, a pending
judgement reads as pending, the reward's colour follows its value, and a garbled judgement
is not shown as a plain success."""

from __future__ import annotations

import pytest

from feedback.models import JudgeResult, JudgeStatus, Trace
from feedback.services.ingest import traces_ingest
from feedback.services.judging import judge_run
from feedback.services.review import comment_add
from tests.factories import user_with_role
from tests.feedback.conftest import TOOLS, tool_conversation
from tests.fixtures.judge import Reply
from tests.judge.conftest import VALID_JUDGEMENT
from training.serving.services import deployment_get_or_create

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

GARBLED = {
    "rubric": {"criteria": [{"criterion": "}}}} ]]] ::: 0 0 0 ~~~ ### {{", "weight": 1}]},
    "rationale": "ok ok ok ok ok ok ok ok ok ok",
    "reward": 0.9,
    "corrected_response": "",
}


def test_judge_this_turn_shows_pending_then_the_result_in_place(open_page, judge_settings, settings, screenshot):
    settings.JUDGE_AUTO = False  # the turn is judged by hand here, not on the comment
    deployment = deployment_get_or_create(name="support-bot")
    long_chat = [*tool_conversation()[:2], *[{"role": "user", "content": f"Filler {i}"} for i in range(12)]]
    traces_ingest(
        deployment=deployment,
        items=[{"external_id": "conv-1", "tools": TOOLS, "messages": [*long_chat, *tool_conversation()[2:]]}],
    )
    trace = Trace.objects.get()
    answer = trace.messages.filter(role="assistant").order_by("-position").first()
    operator = user_with_role("operator", "olga")
    comment_add(message=answer, author=operator, body="No tracking number given.")

    page = open_page(operator)
    page.goto(f"/traces/{trace.pk}/")
    block = page.locator(f"#judge-{answer.position}")
    block.scroll_into_view_if_needed()
    scrolled = page.evaluate("window.scrollY")
    assert scrolled > 0
    page.evaluate("window.__same_page = true")
    block.locator("button:has-text('Judge this turn')").click()

    # Queued: the block says so where the button was; no reload, no jump to the top.
    block.locator(".status-pending:has-text('Pending')").wait_for()
    assert page.evaluate("window.__same_page") is True
    assert page.evaluate("window.scrollY") == scrolled
    assert "reload" not in page.inner_text("body").lower()
    assert block.locator("button:has-text('Judge again')").is_disabled()
    result = JudgeResult.objects.get()
    assert result.status == JudgeStatus.PENDING

    judge_settings.respond_with(lambda request: Reply.json(VALID_JUDGEMENT))
    judge_run(result=result)  # what the worker does
    # The block polls while pending: the judgement arrives without a reload.
    block.locator(".status-succeeded").wait_for(timeout=10_000)
    assert page.evaluate("window.__same_page") is True
    reward = block.locator(".badge.reward")
    assert reward.inner_text() == "reward 0.20"
    assert "reward-low" in reward.get_attribute("class")
    assert page.evaluate("getComputedStyle(document.querySelector('.badge.reward')).color") == "rgb(180, 35, 24)"
    assert "Looks up the order before answering" in block.inner_text()
    # The side panel's row for the turn shows the new reward too, without a reload.
    page.locator("#side-turns tbody tr:last-child .badge.reward:has-text('0.20')").wait_for()
    screenshot(page, "judge-turn", element=page.locator(f"#msg-{answer.position}"))

    # A judgement whose words are garbled passes the schema, but is not shown as plain success.
    judge_settings.respond_with(lambda request: Reply.json(GARBLED))
    block.locator("button:has-text('Judge again')").click()
    block.locator(".status-pending").wait_for()
    judge_run(result=JudgeResult.objects.get(status=JudgeStatus.PENDING))
    block.locator(".status-doubtful:has-text('Succeeded, doubtful')").wait_for(timeout=10_000)
    assert block.locator(".status-succeeded").count() == 0
    doubts = block.locator(".judge-doubts").inner_text()
    assert "rationale is garbled" in doubts and "1 of 1 rubric criteria are garbled" in doubts
    assert "reward-high" in block.locator(".badge.reward").get_attribute("class")


def test_judge_this_turn_without_a_judge_says_why_in_place(open_page, settings):
    settings.JUDGE_BASE_URL = ""
    settings.JUDGE_MODEL = ""
    deployment = deployment_get_or_create(name="support-bot")
    traces_ingest(deployment=deployment, items=[{"external_id": "c", "tools": TOOLS, "messages": tool_conversation()}])
    trace = Trace.objects.get()
    page = open_page(user_with_role("operator", "olga"))
    page.goto(f"/traces/{trace.pk}/")
    page.click("#judge-4 button:has-text('Judge this turn')")
    page.locator("#judge-4 .error[role=alert]").wait_for()
    assert JudgeResult.objects.count() == 0
