"""Learning policies in real headless Chromium: an operator creates a policy from the form,
watches its history take a fired run to an open promotion request without a reload, and an
approver approves the request from its page. No worker runs: the test finishes the job and
the evaluation itself, as a worker would, and calls the tick beat would send."""

from __future__ import annotations

import pytest

from tests.training.policies import commented_turns, finish_evaluation, finish_job
from training.learning_policies.models import LearningPolicy
from training.learning_policies.services import learning_policies_tick
from training.promotion.models import PromotionStatus
from training.serving.models import LiveVersion

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_create_a_policy_follow_its_run_and_approve_its_request(open_page, screenshot, world):
    page = open_page(world["olga"])
    page.goto("/training/policies/")
    form = page.locator("#policy-form")
    form.locator("input[name=name]").fill("fix-lookups")
    form.locator("select[name=deployment]").select_option("support-bot")
    form.locator("input[name=min_new_turns]").fill("3")
    form.locator("select[name=job_kind]").select_option("distill")
    form.locator("textarea[name=job_config]").fill('{"steps": 0}')
    form.locator("select[name=eval_training_set]").select_option(str(world["eval_set"].pk))
    form.locator("input[name=min_win_rate]").fill("0.6")
    form.locator("input[name=notify_user]").fill("arno")
    form.locator("button[type=submit]").click()
    assert "job_config.steps" in page.inner_text("#policy-errors")  # the jobs' own validation, by field

    page.locator("#policy-form textarea[name=job_config]").fill('{"steps": 2}')
    page.locator("#policy-form button[type=submit]").click()
    page.wait_for_selector("h1:has-text('fix-lookups')")
    policy = LearningPolicy.objects.get(name="fix-lookups")
    assert page.url.endswith(f"/training/policies/{policy.pk}/")
    assert "It has not fired yet." in page.inner_text("#history")

    commented_turns(world["deployment"], 3)
    learning_policies_tick()
    page.reload()
    (run,) = policy.runs.all()
    section = page.locator(f"#run-{run.pk}")
    assert "Training" in section.inner_text() and "3 new commented turns so far" in section.inner_text()
    assert "3 turns from 3 comments" in section.inner_text()

    # The worker's part, then the ticks: the history updates in place (htmx polling).
    finish_job(run, world)
    learning_policies_tick()
    run.refresh_from_db()
    finish_evaluation(run, win_rate=0.9, ci_low=0.6, n=9)
    learning_policies_tick()
    page.wait_for_selector(f"#run-{run.pk} :text('Promotion request opened')")
    screenshot(page, "learning-policy-history", full_page=True)
    page.click(f"#run-{run.pk} a[href^='/promotions/']")
    page.wait_for_selector("#learning-policy")
    assert f"run {run.pk}" in page.inner_text("#learning-policy")
    assert page.locator("#approve").count() == 0  # the policy's owner asked: another person decides

    review = open_page(world["arno"])
    run.refresh_from_db()
    review.goto(f"/promotions/{run.promotion_id}/")
    assert "Win rate vs live ≥ 0.60" in review.inner_text("#learning-policy")
    review.fill("textarea[name=comment]", "The policy's evidence holds.")
    review.click("#approve")
    review.wait_for_selector("#release")
    run.promotion.refresh_from_db()
    assert run.promotion.status == PromotionStatus.APPROVED and run.promotion.decided_by == world["arno"]
    # Approval queues the release; only its worker flips the pointer, and none runs here.
    assert LiveVersion.objects.get(deployment=world["deployment"]).version == world["base_version"]
