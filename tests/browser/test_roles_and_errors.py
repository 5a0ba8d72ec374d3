"""Navigation shows each role only what it may open; 404 and 403 pages carry the site's
layout; widgets a role cannot use look disabled."""

from __future__ import annotations

import pytest

from feedback.services.ingest import traces_ingest
from tests.factories import user_with_role
from tests.feedback.conftest import TOOLS, tool_conversation
from training.serving.services import deployment_get_or_create

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

EXPECTED = {
    "operator": {"Tour", "Overview", "Traces", "Queues", "Judge", "Failure modes", "Training", "Models"},
    "reviewer": {"Queues"},
    "approver": {"Tour", "Overview", "Traces", "Judge", "Failure modes", "Training", "Models", "Notifications"},
}


@pytest.mark.parametrize("role", sorted(EXPECTED))
def test_each_role_sees_only_the_pages_it_may_open(open_page, role):
    deployment_get_or_create(name="support-bot")
    page = open_page(user_with_role(role, f"{role}-1"))
    page.goto("/")
    links = page.locator(".topbar nav a")
    names = links.all_inner_texts()
    assert set(names) == EXPECTED[role]
    hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
    for href in hrefs:
        response = page.goto(href)
        assert response.status == 200, (role, href, response.status)
        assert page.locator(".topbar nav a[aria-current=page]").count() == 1, href


def test_404_and_403_pages_carry_the_site_layout(open_page):
    page = open_page(user_with_role("operator", "olga"))
    response = page.goto("/traces/987654/")
    assert response.status == 404
    assert page.locator(".topbar nav a").count() == 8
    assert page.locator("h1").inner_text() == "Not found"
    assert page.evaluate("getComputedStyle(document.querySelector('.topbar')).display") == "flex"  # styled

    page = open_page(user_with_role("reviewer", "rita"))
    response = page.goto("/traces/")
    assert response.status == 403
    assert page.locator(".topbar nav a").all_inner_texts() == ["Queues"]
    assert page.locator("h1").inner_text() == "Not allowed"
    assert page.locator("a:has-text('Go to your annotation queues')").count() == 1


def test_widgets_a_role_cannot_use_look_disabled(open_page):
    deployment = deployment_get_or_create(name="support-bot")
    (result,) = traces_ingest(
        deployment=deployment, items=[{"external_id": "c", "tools": TOOLS, "messages": tool_conversation()}]
    )
    page = open_page(user_with_role("approver", "abe"))
    page.goto(f"/traces/{result.trace_id}/")
    button = page.locator("#rating-4 button[value=up]")
    style = button.evaluate("b => { const s = getComputedStyle(b); return [s.opacity, s.cursor]; }")
    assert float(style[0]) < 0.6 and style[1] == "not-allowed"
    assert page.locator("#rating-4 form").get_attribute("title") == "Your role cannot rate turns"
    assert page.locator("#comments-4 details.comment-new").count() == 0  # no comment box to type into
