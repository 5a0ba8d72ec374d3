"""Progressive release in headless Chromium: the approver chooses a plan on the approval form,
reads what it does on the confirmation, and the release page shows the steps as they happen
(htmx, no reload): the first step once the release has loaded the candidate, then the next one
the check decides, with who decided it and why. Its buttons act on the step the page was loaded
at, and a reason being typed survives the panel's redraws. What the page shows of a reason is
escaped."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

import training.promotion.services.release as release_service
from feedback.models import Message, Trace
from tests.factories import DeploymentFactory, user_with_role
from tests.promotion.conftest import evaluation_row, make_adapter_folder
from training.inference.server import free_port
from training.promotion.models import Release
from training.promotion.rollout_models import Rollout, RolloutState
from training.promotion.services.promotion import promotion_request_create
from training.promotion.services.release_plans import release_plan_create
from training.promotion.services.rollouts import rollout_check
from training.serving.services import base_model_register, live_version_set, model_version_create
from webapp.kernel.work import work_claim

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]

STEPS = [
    {"share": 0.05, "min_conversations": 2, "min_minutes": 0},
    {"share": 0.25, "min_conversations": 2, "min_minutes": 0},
    {"share": 1.0},
]


def served(deployment, version, n: int, at, answer: str) -> None:
    for _ in range(n):
        trace = Trace.objects.create(
            deployment=deployment, external_id=f"t-{Trace.objects.count()}", model_version=version, started_at=at
        )
        Message.objects.create(
            trace=trace, position=0, role="assistant", content=answer, raw={}, model_version=version, created_at=at
        )


def wait_text(page, selector: str, text: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while text not in page.inner_text(selector):
        if time.monotonic() > deadline:
            raise AssertionError(f"{selector} never showed {text!r}: {page.inner_text(selector)!r}")
        time.sleep(0.1)


def test_the_approver_chooses_a_plan_and_the_release_page_shows_the_steps(
    transactional_db, open_page, screenshot, tmp_path
):
    operator, approver = user_with_role("operator", "olga"), user_with_role("approver", "arno")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    base, live = base_model_register(
        name="smol", path=tmp_path / "base", inference_url=f"http://127.0.0.1:{free_port()}"
    )
    deployment = DeploymentFactory(name="support-bot")
    live_version_set(deployment=deployment, version=live)
    candidate = model_version_create(
        name="smol-v1", base_model=base, kind="lora", path=make_adapter_folder(tmp_path / "v1"), parent=live
    )
    plan = release_plan_create(name="careful", deployment=deployment, steps=STEPS)
    release_plan_create(name="halves", deployment=deployment, steps=[{"share": 0.5}, {"share": 1}], is_default=True)
    promotion = promotion_request_create(
        candidate=candidate,
        deployment=deployment,
        evaluation=evaluation_row(candidate, deployment, live),
        requested_by=operator,
    )

    page = open_page(approver)
    page.goto(f"/promotions/{promotion.pk}/")
    # The deployment's default is preselected; the approver chooses another.
    assert page.locator("#plan-choice option:checked").inner_text() == "halves: 50 % → 100 %"
    page.select_option("#plan-choice", value=str(plan.pk))
    page.click("#approve")
    chosen = page.inner_text("#approval-plan")
    assert chosen.startswith("careful: 5 % (at least 2 conversations and 0 min) → 25 %") and "→ 100 %." in chosen
    assert "5 %" in page.inner_text("#confirm-approve")
    page.click("#confirm-approve")
    page.wait_for_selector("#promotion-status:has-text('Approved, deploying')")
    rollout = Rollout.objects.get(promotion=promotion)
    assert rollout.plan["name"] == "careful" and rollout.state == RolloutState.STARTING

    # The deploy worker's part (tested with a real worker and vLLM in tests/promotion/test_rollout_vllm.py):
    # loaded and smoke-tested, where it would flip the pointer it routes the first step.
    assert work_claim(Release, pk=rollout.release_id, worker="w") is not None
    release_service._flip(rollout.release, "w")
    page.click(f"#rollout-link-{rollout.pk}")
    wait_text(page, "#rollout-state", "Running")
    assert page.inner_text("#rollout-share") == "5 %"
    page.evaluate("window.__same_page = true")

    rollout.refresh_from_db()
    at = rollout.step_started_at
    served(deployment, live, 8, at, "Happy to help.")
    served(deployment, candidate, 3, at, "Happy to help <b>now</b>.")
    decision = rollout_check(rollout_id=rollout.pk, now=at + timedelta(seconds=5))
    assert decision.action == "advance", decision.reason
    wait_text(page, "#rollout-share", "25 %")
    assert page.evaluate("window.__same_page") is True  # htmx swapped the panel in
    rows = page.locator("#rollout-changes tr.rollout-change")
    assert rows.count() == 3
    assert "automatic" in rows.nth(2).inner_text() and "every signal at least" in rows.nth(2).inner_text()
    assert (
        page.locator("#rollout-steps li.done").count() == 1 and page.locator("#rollout-steps li.current").count() == 1
    )
    assert page.locator("#chart-share svg").count() == 1 and page.locator("#chart-empty_rate svg").count() == 1

    # The buttons were drawn at 5 %: the redrawn panel says the release moved, and "advance"
    # from there is refused instead of taking 25 % to all traffic.
    wait_text(page, "#rollout-moved", "moved to 25 %")
    page.click("#rollout-advance")
    wait_text(page, ".flash", "moved to 25 % since you loaded the page")
    rollout.refresh_from_db()
    assert (rollout.state, rollout.step) == (RolloutState.RUNNING, 1)

    # A reason typed survives the panel's redraws (every 2 s): it is outside the panel.
    assert "25 %" in page.inner_text("#rollout-seen")
    page.fill("#rollout-reason-input", "<img src=x onerror=alert(1)> watching")
    for _ in range(2):  # a mark on the panel goes with it when a redraw replaces it
        page.evaluate("document.getElementById('rollout-panel').dataset.mark = 'seen'")
        page.wait_for_selector("#rollout-panel:not([data-mark])", timeout=10_000)
    assert page.input_value("#rollout-reason-input") == "<img src=x onerror=alert(1)> watching"
    page.click("#rollout-hold")
    wait_text(page, "#rollout-state", "Held")
    assert "<img src=x onerror=alert(1)> watching" in page.inner_text("#rollout-reason")
    assert page.locator("#rollout-reason img").count() == 0
    last = page.locator("#rollout-changes tr.rollout-change").last.inner_text()
    assert "arno" in last and "<img src=x onerror=alert(1)> watching" in last
    screenshot(page, "progressive-release", full_page=True)
