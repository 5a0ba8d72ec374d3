"""A queue built from customers' negative feedback, with instructions, a rubric and score
dimensions, worked in Chromium: each item opens with the user's request, the instructions and
rubric, and the reviewer saves a score per dimension; at 1400 and 390 px wide without the
page scrolling sideways."""

from __future__ import annotations

import re

import pytest

from feedback.models import AnnotationQueue, QueueScore, Trace
from feedback.services.customer_feedback import customer_feedback_create
from feedback.services.ingest import traces_ingest
from tests.browser.test_trace_outcomes import overflowing
from tests.factories import user_with_role
from training.serving.services import deployment_get_or_create

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
WIDTHS = (1400, 390)
DIMENSIONS = """right_order: boolean | The agent acted on the order the customer named
helpfulness: numeric 1-5 | How far the answer solved the customer's problem
failure: categorical wrong-order, refused-wrongly, rude, none | What went wrong, if anything"""


def complained_about():
    deployment = deployment_get_or_create(name="support-bot")
    results = traces_ingest(
        deployment=deployment,
        items=[
            {
                "external_id": f"chat-{i}",
                "started_at": f"2026-12-0{i + 1}T10:00:00Z",
                "messages": [
                    {"role": "system", "content": "You are Acme's support agent."},
                    {"role": "user", "content": f"Please refund order A100{i}: the <kettle> arrived broken."},
                    {"role": "assistant", "content": f"I have refunded order A200{i}."},
                ],
            }
            for i in range(3)
        ],
    )
    for r in results[:2]:
        customer_feedback_create(
            deployment=deployment, data={"trace_id": r.trace_id, "rating": "down", "comment": "wrong order"}
        )


@pytest.mark.parametrize("width", WIDTHS)
def test_a_queue_from_negative_feedback_states_each_task_and_takes_a_score_per_dimension(open_page, screenshot, width):
    complained_about()
    operator = open_page(user_with_role("operator", "olga"), width=width)
    operator.goto("/traces/?rating=negative")
    operator.click("summary:has-text('Build an annotation queue')")
    operator.fill("#queue-form input[name=name]", "Refund complaints")
    operator.click("#queue-form summary:has-text('Instructions, rubric')")
    operator.fill("#queue-form textarea[name=instructions]", "Check the agent refunded the order the customer named.")
    operator.fill("#queue-form textarea[name=rubric]", "5: the right order, politely.\n1: another customer's order.")
    operator.fill("#queue-form textarea[name=dimensions]", DIMENSIONS)
    operator.click("#queue-form button[type=submit]")
    operator.wait_for_url(re.compile(r"/queues/\d+/$"))
    queue = AnnotationQueue.objects.get()
    assert queue.item_count == 2 and queue.filters == {"rating": ["negative"]}
    assert operator.locator("#queue-dimensions tbody tr").count() == 3

    page = open_page(user_with_role("reviewer", "rita"), width=width)
    page.goto(f"/queues/{queue.pk}/")
    page.click("#queue-next")
    page.wait_for_url(re.compile(r"/items/\d+/$"))
    brief = page.locator("#queue-brief")
    # The user's request comes first, as text, above the instructions and the conversation.
    trace = Trace.objects.get(pk=queue.items.order_by("position").first().trace_id)
    asked = trace.messages.get(position=1).content
    assert brief.locator("#queue-task blockquote").inner_text() == asked
    assert brief.bounding_box()["y"] < page.locator(".conversation").bounding_box()["y"]
    assert "Check the agent refunded the order" in brief.locator("#queue-instructions").inner_text()
    assert "another customer's order" in brief.locator("#queue-rubric").inner_text()
    assert brief.locator("fieldset.dimension").count() == 3
    assert overflowing(page, width) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    # The side panel's turn table: one-word headers stay whole ("Latency", never "LATENC Y").
    lines = page.evaluate(
        """() => [...document.querySelectorAll("#side-turns thead th")].map((th) => {
            const range = document.createRange();
            range.selectNodeContents(th);
            return [th.textContent.trim(), new Set([...range.getClientRects()].map((r) => Math.round(r.top))).size];
        })"""
    )
    assert {name: n for name, n in lines if " " not in name} == {
        "Turn": 1,
        "Latency": 1,
        "Tokens": 1,
        "Feedback": 1,
        "Judge": 1,
    }

    page.check("input[name=score-right_order][value=no]")
    page.fill("input[name=score-helpfulness]", "2")
    page.check("input[name=score-failure][value=wrong-order]")
    if width == 1400:
        screenshot(page, "queue-rubric")
    page.click("#save-scores")
    brief.locator(".saved").wait_for()
    assert "3 of 3 scored by you" in brief.locator("h2", has_text="Scores").text_content()
    scores = {s.dimension.name: (s.value, s.label) for s in QueueScore.objects.select_related("dimension")}
    assert scores == {"right_order": (0.0, "no"), "helpfulness": (2.0, ""), "failure": (None, "wrong-order")}
    # Back on the item later, the reviewer's answers are there.
    page.reload()
    assert page.locator("input[name=score-helpfulness]").input_value() == "2"
    assert page.locator("input[name=score-failure][value=wrong-order]").is_checked()
