"""A reviewer's day with the keyboard alone: a queue of five items, commented, rated and done."""

from __future__ import annotations

import re

import pytest

from feedback.models import Comment, QueueItem, Trace, TurnRating
from feedback.selectors.trace_list import traces_filtered
from feedback.services.ingest import traces_ingest
from feedback.services.queues import queue_create
from tests.factories import user_with_role
from tests.feedback.conftest import TOOLS, tool_conversation
from training.serving.services import deployment_get_or_create

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def five_item_queue(operator):
    deployment = deployment_get_or_create(name="support-bot")
    traces_ingest(
        deployment=deployment,
        items=[
            {
                "external_id": f"chat-{i}",
                "started_at": f"2026-11-2{i}T10:00:00Z",
                "tools": TOOLS,
                "messages": [
                    *tool_conversation(f"Where is order A{i}?", f"Order A{i} has shipped.")[:-1],
                    {"role": "assistant", "content": f"Order A{i} has shipped.", "response_id": f"chatcmpl-{i}"},
                ],
            }
            for i in range(5)
        ],
    )
    return queue_create(
        name="five chats", traces=traces_filtered({}).order_by("external_id"), filters={}, created_by=operator
    )


def item_number(page) -> int:
    return int(re.search(r"item (\d+) of 5", page.locator("#queue-bar").inner_text()).group(1))


def test_a_reviewer_completes_a_queue_of_five_with_the_keyboard_alone(open_page, screenshot):
    queue = five_item_queue(user_with_role("operator", "olga"))
    rita = user_with_role("reviewer", "rita")
    page = open_page(rita)
    page.goto(f"/queues/{queue.pk}/")
    # The queue page lists its items with their state before anyone starts.
    states = page.locator("#queue-items tr.queue-item").evaluate_all("rows => rows.map(r => r.dataset.state)")
    assert states == ["pending"] * 5
    assert page.locator("#queue-next kbd").inner_text() == "j"

    page.keyboard.press("j")
    page.wait_for_url(re.compile(r"/items/\d+/$"))
    # Key hints render as keys, and the first item has no previous one.
    assert page.locator("#key-hints kbd").count() >= 10
    assert page.locator("#queue-bar .disabled").inner_text().startswith("← Previous item")

    for n in range(1, 6):
        assert item_number(page) == n
        here = page.url
        page.keyboard.press("c")
        box = page.locator(".msg.current textarea[name=body]")
        box.wait_for(state="visible")
        page.keyboard.type(f"Item {n}: should have linked the tracking page.")
        page.keyboard.press("Control+Enter")
        page.locator(".msg.current .comment-body").wait_for()
        # The comment box is gone after sending: the keys are the reviewer's again.
        page.keyboard.type("-" if n % 2 else "+")
        page.locator(".msg.current .rating button.thumb.active").wait_for()
        page.keyboard.press(str(n))
        page.locator(f".msg.current .rating button.score.active[value='{n}']").wait_for()
        if n == 3:
            screenshot(page, "queue-item-keyboard", full_page=True)
        if n == 2:
            # Back to the item just finished, and forward again, without losing anything.
            page.keyboard.press("k")
            page.wait_for_url(lambda url, here=here: url != here)
            assert item_number(page) == 1
            assert "done by rita" in page.locator("#queue-bar").inner_text()
            assert "Item 1:" in page.locator(".comments").last.inner_text()
            page.keyboard.press("j")
            page.wait_for_url(here)
        page.keyboard.press("d")
        if n < 5:
            page.wait_for_url(lambda url, here=here: url != here and "/items/" in url)
    page.wait_for_url(re.compile(rf"/queues/{queue.pk}/$"))
    assert "5 of 5 done" in page.locator(".progress-line").inner_text()
    states = page.locator("#queue-items tr.queue-item").evaluate_all("rows => rows.map(r => r.dataset.state)")
    assert states == ["done"] * 5
    screenshot(page, "queue-detail")

    assert QueueItem.objects.filter(queue=queue, status="done", done_by=rita).count() == 5
    assert Comment.objects.filter(author=rita).count() == 5
    # One rating per person and turn: the score pressed after the thumb replaced it.
    ratings = {r.trace.external_id: (r.kind, r.value) for r in TurnRating.objects.select_related("trace")}
    assert ratings == {f"chat-{i}": ("score", i + 1) for i in range(5)}
    # The comments landed on the answers the reviewer was looking at (the last assistant turn).
    last_turns = {t.pk: t.message_count - 1 for t in Trace.objects.all()}
    assert all(c.message.position == last_turns[c.trace_id] for c in Comment.objects.select_related("message"))
