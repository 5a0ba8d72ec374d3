"""The trace page uses the width: beside the conversation a side panel with the trace's
metadata, the feedback and judgements on its turns, their serving data, a latency timeline
of the turns, and a gateway trace's duration."""

from __future__ import annotations

import dataclasses

import pytest

from feedback.models import JudgeResult, JudgeStatus, JudgeTrigger, Trace
from feedback.services.capture import TraceDigestCache, exchanges_record
from feedback.services.customer_feedback import customer_feedback_create
from tests.factories import user_with_role
from tests.feedback.test_capture import answer, exchange
from training.serving.services import deployment_get_or_create

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def gateway_trace() -> Trace:
    deployment = deployment_get_or_create(name="support-bot")
    u1 = {"role": "user", "content": "Where is order A1?"}
    first = dataclasses.replace(
        exchange(deployment, [u1], response=answer("Let me look.", rid="chatcmpl-a")),
        started_at=1_800_000_000.0,
        latency_ms=800.0,
        metadata={"customer_tier": "gold", "environment": "web"},
    )
    more = [u1, {"role": "assistant", "content": "Let me look."}, {"role": "user", "content": "Thanks"}]
    second = dataclasses.replace(
        exchange(deployment, more, response=answer("It has shipped.", rid="chatcmpl-b")),
        started_at=1_800_000_003.0,
        latency_ms=1200.0,
    )
    exchanges_record(exchanges=[first], cache=TraceDigestCache())
    exchanges_record(exchanges=[second], cache=TraceDigestCache())
    trace = Trace.objects.get()
    customer_feedback_create(
        deployment=deployment, data={"response_id": "chatcmpl-b", "rating": "down", "comment": "No tracking link"}
    )
    JudgeResult.objects.create(
        trace=trace,
        message=trace.messages.get(position=3),
        trigger=JudgeTrigger.MANUAL,
        status=JudgeStatus.SUCCEEDED,
        reward=0.85,
        rationale="Answered the question.",
        judge_model="test-judge",
    )
    return trace


def test_the_side_panel_sits_beside_the_conversation_with_the_traces_facts(open_page, screenshot):
    trace = gateway_trace()
    page = open_page(user_with_role("operator", "olga"), width=1600)
    page.goto(f"/traces/{trace.pk}/")
    side, chat = page.locator("#trace-side"), page.locator(".conversation")
    side_box, chat_box = side.bounding_box(), chat.bounding_box()
    # Beside, not below: the panel starts where the conversation starts, to its right.
    assert side_box["x"] >= chat_box["x"] + chat_box["width"]
    assert abs(side_box["y"] - chat_box["y"]) < 80
    # The page is used: the two together span most of its width.
    assert side_box["x"] + side_box["width"] - chat_box["x"] > 0.9 * 1600 - 60

    # From the first request (t) to the last answer (t + 3 s + 1.2 s).
    assert page.locator("#trace-duration").inner_text() == "4.20 s"
    assert "customer_tier" in side.locator("#side-facts .meta").inner_text()
    turns = side.locator("#side-turns tbody tr")
    assert turns.count() == 2
    assert "800 ms" in turns.nth(0).inner_text() and "chatcmpl-a" in turns.nth(0).inner_text()
    assert "1200 ms" in turns.nth(1).inner_text() and "0.85" in turns.nth(1).inner_text()
    assert "reward-high" in turns.nth(1).locator(".badge.reward").get_attribute("class")
    assert "No tracking link" in side.locator("#side-feedback").inner_text()

    bars = side.locator("#side-timeline .timeline-bar")
    assert bars.count() == 2
    first, second = bars.nth(0).bounding_box(), bars.nth(1).bounding_box()
    # The second turn started 3 s after the first, and took longer.
    assert second["x"] > first["x"] + first["width"] and second["width"] > first["width"]
    screenshot(page, "trace-side-panel")

    # Rating or commenting a turn updates the panel's summary in place.
    page.click("#rating-3 button[value=down]")
    side.locator("#side-turns tbody tr:nth-child(2) td:has-text('▼1')").wait_for()
    page.click("#comments-3 summary:has-text('Comment')")
    page.fill("#comments-3 textarea[name=body]", "Give the tracking link.")
    page.keyboard.press("Control+Enter")
    side.locator("#side-turns tbody tr:nth-child(2) td:has-text('✎1')").wait_for()


def test_on_a_narrow_screen_the_panel_goes_below(open_page):
    trace = gateway_trace()
    page = open_page(user_with_role("operator", "olga"), width=800)
    page.goto(f"/traces/{trace.pk}/")
    assert page.locator("#trace-side").bounding_box()["y"] > page.locator(".conversation").bounding_box()["y"]
    assert page.evaluate("document.documentElement.scrollWidth") <= 800
