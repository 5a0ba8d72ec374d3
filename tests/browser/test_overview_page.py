"""The overview page in real headless Chromium: reached from the nav, it shows the live
version, each version's success rate and the chart, and a hostile description stays text."""

from __future__ import annotations

import inspect

import pytest

from tests.factories import user_with_role
from tests.test_overview import graded_traces, versions  # noqa: F401 - the fixture

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_overview_shows_each_versions_success_rate_and_the_live_one(open_page, versions, screenshot):  # noqa: F811
    from training.serving.services import live_version_set

    deployment, base_version, candidate = versions
    graded_traces(deployment, base_version, [True, False, False, False])
    live_version_set(deployment=deployment, version=candidate)
    graded_traces(deployment, candidate, [True, True, False, True], start=10)

    page = open_page(user_with_role("operator"))
    page.goto("/traces/")
    page.click("nav a:has-text('Overview')")
    page.wait_for_url("**/overview/")
    section = page.locator("#deployment-support-bot")
    assert section.locator(".live-version").inner_text() == "smol-v1"
    rows = {
        row.get_attribute("data-version"): (
            row.locator(".success-rate").inner_text(),
            row.locator(".heldout-success").inner_text(),
        )
        for row in section.locator("tr.version-row").all()
    }
    assert rows == {"smol": ("0.250", "0.250 (1/4)"), "smol-v1": ("0.750", "0.750 (3/4)")}
    curve = section.locator(f"#chart-success-{deployment.pk}-figure")
    curve.locator("canvas").wait_for()
    assert curve.locator(".u-legend .u-series th").all_inner_texts()[1:] == ["smol", "smol-v1"]
    # It says what it compares: both versions on the same split (the one their traces name).
    split = inspect.signature(graded_traces).parameters["split"].default
    assert section.locator(".compare-split").inner_text() == split
    assert f"on {split} tasks" in curve.locator("figcaption").inner_text()
    assert "<script>" in section.inner_text()  # the description is shown as text, not run
    assert page.evaluate("window.__overview_xss === undefined")
    page.select_option("select[name=days]", "30")
    page.click("button:has-text('Show')")
    page.wait_for_url("**/overview/?days=30")
    # Traces per day: a bar chart of the window's 30 days, as wide as the section.
    traffic = section.locator(f"#chart-traffic-{deployment.pk}-figure")
    traffic.locator("canvas").wait_for()
    assert traffic.evaluate("f => f.uplot.data[0].length") == 30
    assert traffic.evaluate("f => f.uplot.data[1].slice(-1)[0]") == 8  # today's traces
    screenshot(page, "overview", full_page=True)
