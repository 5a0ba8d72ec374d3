"""While `make demo`'s agent is still working, the tour says how far it has got (n/36
episodes) and updates itself until it is ready."""

from __future__ import annotations

import pytest

from feedback.services.capture import TraceDigestCache, exchanges_record
from tests.factories import user_with_role
from tests.feedback.test_capture import answer, exchange
from training.serving.services import deployment_get_or_create

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def episodes(deployment, start: int, n: int) -> None:
    exchanges_record(
        exchanges=[
            exchange(deployment, [{"role": "user", "content": f"Task {i}"}], response=answer("Done."), key=f"ep-{i}")
            for i in range(start, start + n)
        ],
        cache=TraceDigestCache(),
    )


def test_the_tour_shows_the_demo_agents_progress_until_ready(open_page, settings):
    settings.DEMO_EPISODES = 3
    deployment = deployment_get_or_create(name="support-bot")
    page = open_page(user_with_role("operator", "olga"))
    page.goto("/tour/")
    readiness = page.locator("#demo-readiness")
    assert "0/3" in readiness.inner_text() and "Getting ready" in readiness.inner_text()

    episodes(deployment, 0, 1)
    page.locator("#demo-readiness b:has-text('1/3')").wait_for(timeout=10_000)
    episodes(deployment, 1, 2)
    page.locator("#demo-readiness.ready").wait_for(timeout=10_000)
    assert "3/3" in page.locator("#demo-readiness").inner_text()
    assert page.locator("#step-traces").get_attribute("data-done") == "true"


def test_outside_the_demo_there_is_no_readiness_line(open_page, settings):
    settings.DEMO_EPISODES = 0
    deployment_get_or_create(name="support-bot")
    page = open_page(user_with_role("operator", "olga"))
    page.goto("/tour/")
    assert page.locator("#demo-readiness").count() == 0
