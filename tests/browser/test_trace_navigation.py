"""Moving around the trace list and into traces in real headless Chromium: back and forward
keep the filter form, the loaded rows and the scroll position with the URL, and a deep link
to a turn keeps its #fragment through the login."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from feedback.models import Trace
from feedback.services.ingest import traces_ingest
from feedback.services.search import traces_search_index
from tests.factories import user_with_role
from tests.feedback.conftest import TOOLS, tool_conversation
from training.serving.services import deployment_get_or_create

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def seed(n: int) -> None:
    deployment = deployment_get_or_create(name="support-bot")
    results = traces_ingest(
        deployment=deployment,
        items=[
            {
                "external_id": f"conv-{i:03d}",
                "environment": "web" if i % 2 else "phone",
                "started_at": f"2026-11-{1 + i // 24:02d}T{i % 24:02d}:00:00Z",
                "tools": TOOLS,
                "messages": tool_conversation("Where is my blender?" if i % 3 == 0 else "Hello", "It has shipped."),
            }
            for i in range(n)
        ],
    )
    traces_search_index(trace_ids=[r.trace_id for r in results])


def row_count(page) -> int:
    return page.locator("tr.trace-row").count()


def test_back_and_forward_keep_loaded_rows_scroll_and_filters(open_page):
    seed(120)
    page = open_page(user_with_role("operator", "olga"))
    page.goto("/traces/")
    assert row_count(page) == 50
    page.click("tr.load-more a")
    expect(page.locator("tr.trace-row")).to_have_count(100)
    page.wait_for_url(re.compile(r"/traces/\?shown=100$"))

    # Scroll down to the 80th row and open it; back returns to the same rows and place.
    row = page.locator("tr.trace-row").nth(79)
    row.scroll_into_view_if_needed()
    page.evaluate("window.scrollBy(0, 120)")
    scrolled = page.evaluate("window.scrollY")
    assert scrolled > 1500
    label = row.locator("a.trace-link").inner_text()
    row.locator("a.trace-link").click()
    page.wait_for_url(re.compile(r"/traces/\d+/$"))
    assert page.locator("h1").inner_text() == label
    page.go_back()
    page.wait_for_url(re.compile(r"/traces/\?shown=100$"))
    expect(page.locator("tr.trace-row")).to_have_count(100)
    assert abs(page.evaluate("window.scrollY") - scrolled) < 40

    # Filters: each step is in the address bar, and back/forward put the form in step with it.
    page.evaluate("window.scrollTo(0, 0)")
    page.fill("input[name=environment]", "web")
    page.press("input[name=environment]", "Enter")
    page.wait_for_url(re.compile(r"/traces/\?environment=web$"))
    page.fill("#id_q", "blender")
    page.wait_for_url(re.compile(r"environment=web&q=blender|q=blender&environment=web"))
    expect(page.locator("tr.trace-row")).to_have_count(20)
    page.go_back()
    page.wait_for_url(re.compile(r"/traces/\?environment=web$"))
    expect(page.locator("tr.trace-row")).to_have_count(50)
    assert page.input_value("#id_q") == ""
    assert page.input_value("input[name=environment]") == "web"
    page.go_forward()
    page.wait_for_url(re.compile(r"q=blender"))
    expect(page.locator("tr.trace-row")).to_have_count(20)
    assert page.input_value("#id_q") == "blender"
    page.go_back()
    page.go_back()
    page.wait_for_url(re.compile(r"/traces/\?shown=100$"))
    assert page.input_value("input[name=environment]") == "" and page.input_value("#id_q") == ""


def test_a_deep_link_to_a_turn_keeps_its_fragment_through_login(open_page):
    seed(1)
    trace = Trace.objects.get()
    user_with_role("operator", "olga").set_password("pw-for-tests-1")
    page = open_page()
    page.goto(f"/traces/{trace.pk}/#msg-4")
    page.wait_for_url(re.compile(r"/login/"))
    page.fill("#id_username", "olga")
    page.fill("#id_password", "pw-for-tests-1")
    page.click("button:has-text('Log in')")
    page.wait_for_url(re.compile(rf"/traces/{trace.pk}/#msg-4$"))
    assert page.evaluate("document.querySelector(':target').id") == "msg-4"
