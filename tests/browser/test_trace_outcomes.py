"""The trace list in Chromium finds failed conversations: an Outcome column whose grader's
reason shows on hover and is read by screen readers, an Outcome filter with a loading sign
while the results come, at 1400 and 390 px wide without the page scrolling sideways."""

from __future__ import annotations

import pytest

from feedback.services.ingest import traces_ingest
from tests.factories import user_with_role
from training.serving.services import deployment_get_or_create

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]
WIDTHS = (1400, 390)


def overflowing(page, width: int) -> list[str]:
    """What sticks out past the right edge of a `width`-wide page (not inside a box that
    scrolls on its own)."""
    return page.evaluate(
        """(width) => [...document.querySelectorAll("body *")]
            .filter((e) => e.getBoundingClientRect().right > width + 1 && !e.closest(".scroll-x"))
            .map((e) => e.tagName + (e.id ? "#" + e.id : "") + "." + e.className).slice(0, 8)""",
        width,
    )


SYSTEM = "You are Acme's support agent. Refunds follow the refund policy."
REASON = "refunded order A1002, but the customer asked about A1001"


def graded_episodes():
    deployment = deployment_get_or_create(name="support-bot")
    outcomes = ["failure", "success", "success", "failure", None, "success"]
    traces_ingest(
        deployment=deployment,
        items=[
            {
                "external_id": f"demo-run1-test-{i:03d}",
                "environment": "support-desk",
                "started_at": f"2026-12-01T10:0{i}:00Z",
                "ended_at": f"2026-12-01T10:0{i}:0{i + 1}Z",
                "messages": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"I'd like a refund for order A100{i}, it arrived broken."},
                    {
                        "role": "assistant",
                        "content": "Done: the refund is on its way.",
                        "usage": {"prompt_tokens": 300 + i, "completion_tokens": 20, "total_tokens": 320 + i},
                    },
                ],
                **(
                    {
                        "grades": [
                            {
                                "outcome": outcome,
                                "score": 0.0 if outcome == "failure" else 1.0,
                                "reason": REASON if outcome == "failure" else "refunded the order asked about",
                                "source": "support-desk",
                            }
                        ]
                    }
                    if outcome
                    else {}
                ),
            }
            for i, outcome in enumerate(outcomes)
        ],
    )
    return deployment


@pytest.mark.parametrize("width", WIDTHS)
def test_failed_conversations_show_their_reason_and_the_outcome_filter_finds_them(open_page, screenshot, width):
    graded_episodes()
    page = open_page(user_with_role("operator", "olga"), width=width)
    page.goto("/traces/")
    rows = page.locator("tr.trace-row")
    assert rows.count() == 6
    failure = rows.filter(has_text="demo-run1-test-003").locator(".outcome-failure")
    # The reason is the badge's tooltip on hover, and text a screen reader reads in the cell.
    assert failure.get_attribute("title") == REASON
    failure.hover()
    hidden = rows.filter(has_text="demo-run1-test-003").locator(".visually-hidden")
    assert hidden.text_content() == f": {REASON}"
    assert hidden.bounding_box()["width"] <= 1  # read, not shown twice
    row = rows.filter(has_text="demo-run1-test-003")
    assert row.locator("td.outcome-cell .outcome").inner_text() == "✗ failure"
    cells = row.locator("td").all_inner_texts()
    assert "0.00" in cells and "4.0 s" in cells and "323" in cells  # score, latency, tokens
    assert "ungraded" in rows.filter(has_text="demo-run1-test-004").inner_text()
    assert overflowing(page, width) == []
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    if width == 1400:
        screenshot(page, "trace-list-outcomes")

    # Filtering: while the results are on their way, the list says so.
    held = []
    page.route("**/traces/?*outcome=failure*", lambda route: held.append(route))
    page.select_option("#id_outcome", "failure")
    page.locator("#list-loading").wait_for(state="visible")
    assert page.locator("#list-loading").inner_text().strip() == "Loading…"
    held[0].continue_()
    page.unroute("**/traces/?*outcome=failure*")
    page.locator("#list-loading").wait_for(state="hidden")
    page.wait_for_url("**/traces/?outcome=failure")
    assert [r.strip() for r in page.locator("tr.trace-row a.trace-link").all_inner_texts()] == [
        "demo-run1-test-003",
        "demo-run1-test-000",
    ]
    assert page.evaluate("document.documentElement.scrollWidth") <= width
