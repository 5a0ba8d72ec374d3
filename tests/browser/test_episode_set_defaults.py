"""'Build from episodes' works with its defaults (the support desk's episodes of the demo's
deployment), and when it cannot, its error is in view."""

from __future__ import annotations

import re

import pytest

from tests.factories import DeploymentFactory, user_with_role
from tests.training.test_episode_set_page import logged_episode
from training.environments.support_desk import SupportDesk
from training.models import TrainingSet

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

IN_VIEW = "e => { const r = e.getBoundingClientRect(); return r.top >= 0 && r.top < window.innerHeight; }"


def test_build_from_episodes_with_the_defaults(open_page):
    DeploymentFactory(name="another-bot")  # first by name: the default must not be "the first one"
    deployment = DeploymentFactory(name="support-bot")
    page = open_page(user_with_role("operator", "olga"), height=700)
    page.goto("/training/jobs/")
    form = page.locator("#episode-form")
    assert form.locator("select[name=environment]").input_value() == "support-desk"
    assert form.locator("select[name=deployment]").input_value() == "support-bot"

    # No episodes yet: the refusal says why, where the person is looking.
    form.locator("button:has-text('Build from episodes')").click()
    errors = page.locator("#episode-errors")
    errors.wait_for()
    assert errors.evaluate(IN_VIEW), "the error landed below the fold"
    assert not TrainingSet.objects.exists()

    tasks = [t for t in SupportDesk().tasks() if t.split == "train" and t.hidden.get("graded")][:2]
    for i, task in enumerate(tasks):
        logged_episode(deployment, task, f"ep-{i}")
    page.goto("/training/jobs/")
    page.locator("#episode-form button:has-text('Build from episodes')").click()
    page.wait_for_url(re.compile(r"\?built=\d+"))
    built = TrainingSet.objects.get()
    assert (built.name, built.deployment.name) == ("support-desk-episodes", "support-bot")
