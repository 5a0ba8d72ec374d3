"""Learning policies in real headless Chromium: an operator creates a policy from the form,
watches its history take a fired run to an open promotion request without a reload, and an
approver approves the request from its page, or from the notification the policy's mail
links to. No worker runs: the test finishes the job, the evaluation and the release itself,
as a worker would, and calls the tick beat would send."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from feedback.models import Grade
from tests.test_overview import graded_traces
from tests.training.policies import commented_turns, finish_evaluation, finish_job
from training.learning_policies.models import LearningPolicy
from training.learning_policies.tick import learning_policies_tick
from training.promotion.models import PromotionStatus, Release
from training.promotion.services import release as release_service
from training.serving.models import LiveVersion

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def submit_policy(page, world, *, steps: int) -> None:
    """Fill the new-policy form as an operator would, for `steps` of distillation, and send it."""
    form = page.locator("#policy-form")
    form.locator("input[name=name]").fill("fix-lookups")
    form.locator("select[name=deployment]").select_option("support-bot")
    form.locator("input[name=min_new_turns]").fill("3")
    form.locator("select[name=job_kind]").select_option("distill")
    form.locator("textarea[name=job_config]").fill(f'{{"steps": {steps}}}')
    form.locator("select[name=eval_training_set]").select_option(str(world["eval_set"].pk))
    form.locator("input[name=min_win_rate]").fill("0.6")
    form.locator("input[name=notify_user]").fill("arno")
    form.locator("button[type=submit]").click()


def test_create_a_policy_follow_its_run_and_approve_its_request(open_page, screenshot, world):
    page = open_page(world["olga"])
    page.goto("/training/policies/")
    submit_policy(page, world, steps=0)
    # The jobs' own validation, under the field's label, the cursor in that field.
    assert "Job settings (JSON): steps:" in page.inner_text("#policy-errors")
    page.wait_for_load_state("load")
    assert page.evaluate("document.activeElement.name") == "job_config"

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
    review.click("#confirm-approve")
    review.wait_for_selector("#release")
    run.promotion.refresh_from_db()
    assert run.promotion.status == PromotionStatus.APPROVED and run.promotion.decided_by == world["arno"]
    # Approval queues the release; only its worker flips the pointer, and none runs here.
    assert LiveVersion.objects.get(deployment=world["deployment"]).version == world["base_version"]


# The base went live before the graded traffic the story draws for it.
@pytest.mark.parametrize("world", [{"live_days_ago": 8}], indirect=True)
def test_a_policy_fires_and_its_approver_approves_from_the_notification(
    open_page, screenshot, world, mailoutbox, monkeypatch
):
    owner = open_page(world["olga"])
    owner.goto("/training/policies/")
    submit_policy(owner, world, steps=2)
    owner.wait_for_selector("h1:has-text('fix-lookups')")
    policy = LearningPolicy.objects.get(name="fix-lookups")

    # The live version's traffic so far, graded; then the policy fires on new comments (a
    # worker's part, then the ticks beat would send).
    served = graded_traces(world["deployment"], world["base_version"], [True, False, False, False])
    for days_ago, trace in zip((6, 5, 4, 3), served, strict=True):
        Grade.objects.filter(trace=trace).update(created_at=timezone.now() - timedelta(days=days_ago))
    commented_turns(world["deployment"], 3)
    learning_policies_tick()
    (run,) = policy.runs.all()
    candidate = finish_job(run, world)
    learning_policies_tick()
    run.refresh_from_db()
    finish_evaluation(run, win_rate=0.9, ci_low=0.6, n=9)
    learning_policies_tick()
    run.refresh_from_db()

    # Its history shows the fired run with its evidence and the request it opened.
    owner.reload()
    history = owner.locator(f"#run-{run.pk}")
    history.locator(":text('Promotion request opened')").wait_for()
    text = history.inner_text()
    assert "3 new commented turns so far" in text and "3 turns from 3 comments" in text
    assert "Win rate vs live ≥ 0.60" in text and "win rate 0.90 over 9 items" in text and "(told arno)" in text
    assert owner.locator("#nav-notifications").count() == 0  # olga decides nothing
    # Nothing is live, or on its way, before a person approves.
    promotion = run.promotion
    assert promotion.status == PromotionStatus.PENDING and not Release.objects.exists()
    assert LiveVersion.objects.get(deployment=world["deployment"]).version == world["base_version"]

    # The mail takes the approver to the request in their notifications.
    (mail,) = mailoutbox
    link = re.search(r"(/notifications/#promotion-\d+)", mail.body).group(1)
    assert link == f"/notifications/#promotion-{promotion.pk}"
    review = open_page(world["arno"])
    review.goto("/training/jobs/")
    assert review.inner_text("#inbox-count") == "1"
    review.goto(link)
    card = review.locator(f"#promotion-{promotion.pk}")
    evidence = card.inner_text()
    assert "Opened by learning policy fix-lookups" in evidence and f"run {run.pk}" in evidence
    assert "Trained on 3 turns (3 comments" in evidence and "Win rate vs live ≥ 0.60" in evidence
    assert "90.0%" in evidence and "held-out items of orders" in evidence
    screenshot(review, "notification-approve", full_page=True)
    card.locator("textarea[name=comment]").fill("The policy's evidence holds.")
    card.locator("button.approve").click()
    # The card asks, in place, to confirm what approving does; the comment comes along.
    confirm = review.locator(f"#confirm-{promotion.pk}")
    confirm.wait_for()
    assert "100 %" in confirm.inner_text() and "Roll back to" in confirm.inner_text()
    confirm.locator("button.confirm-approve").click()
    review.wait_for_selector(f"#decided-{promotion.pk}:has-text('Approved, deploying')")
    assert review.locator("#inbox-count").is_hidden()  # nothing left to decide
    assert review.url.endswith(link)  # decided where it was read, without leaving the page
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.APPROVED and promotion.decided_by == world["arno"]
    assert promotion.decision_comment == "The policy's evidence holds."
    (release,) = Release.objects.filter(promotion=promotion)
    # Approval queues the release; the version is not live until its worker has switched it.
    assert LiveVersion.objects.get(deployment=world["deployment"]).version == world["base_version"]

    # The deploy worker's part (the inference server answers), then the deployment's story.
    monkeypatch.setattr(release_service, "release_load", lambda version: {"loaded": "lora", "name": version.name})
    monkeypatch.setattr(release_service, "release_smoke", lambda version: {"tokens": 3, "content": "Hello"})
    release_service.release_run(release_id=release.pk, worker="deploy-test")
    assert LiveVersion.objects.get(deployment=world["deployment"]).version == candidate
    graded_traces(world["deployment"], candidate, [True, True, True, False], start=10)
    review.goto("/overview/")
    review.click("#deployment-support-bot a.story-link")
    review.select_option("select[name=days]", "30")
    review.click("form.inline-form button[type=submit]")
    review.wait_for_url("**/story/?days=30")
    story = review.locator(f"#version-{candidate.name}")
    told = story.inner_text()
    assert "live" in told and "requested by olga" in told and "approved by arno" in told
    assert "3 operator comments" in told and "90.0%" in told and "fired by learning policy fix-lookups" in told
    curve = review.locator("#chart-story-figure")
    curve.locator("canvas").wait_for()
    spec = curve.evaluate("f => JSON.parse(document.getElementById(f.dataset.chart).textContent)")
    assert [m["label"] for m in spec["markers"]] == ["→ smol", "→ smol-v1"]  # smol set live, then smol-v1
    summary = curve.locator(".uchart-summary").text_content()
    assert "smol · graded success: 4 points, last 0%" in summary  # a point per day it was graded
    assert "smol-v1 · graded success: 1 point, last 75%" in summary
    screenshot(review, "deployment-story", full_page=True)
