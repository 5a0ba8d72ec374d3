"""The guided tour, walked in real headless Chromium as `make demo FAST=1` sets it up, with
everything real behind it: the demo agent drives the gateway (uvicorn) with the openai client
in front of a vLLM server that serves `tiny-talking`, the FAST demo's model; the judge is that
server's model, through the product's judge client with the demo's settings (read from
scripts/demo.sh); a Celery worker on Redis runs the judge calls, the training job, the
evaluation and the release.

Each step asserts its effect: the agent's traces appear, the judge's result appears under
the commented turn, the job finishes with a candidate, the approval is recorded, the live
version changes, and the traces of the agent's next run carry the new version's name."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from feedback.models import ApiKey, Comment, JudgeResult, JudgeStatus, Trace
from tests.factories import DeploymentFactory, user_with_role
from tests.fixtures.worker import celery_worker
from training.models import TrainingJob, TrainingSet
from training.promotion.models import AuditEvent, EvaluationItem, PromotionRequest, PromotionStatus
from training.serving.models import LiveVersion, ModelVersion
from webapp.kernel.work import WorkStatus

pytestmark = [pytest.mark.browser, pytest.mark.vllm, pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def demo_judge_env() -> dict[str, str]:
    """The judge's settings scripts/demo.sh exports for its own server (`export
    PRACTICUM_JUDGE_X=${PRACTICUM_JUDGE_X:-value}`), so the test follows the demo when it changes."""
    text = (ROOT / "scripts" / "demo.sh").read_text()
    found = dict(re.findall(r"^\s*export (PRACTICUM_JUDGE_\w+)=\$\{\1:-([^}$]+)\}$", text, re.M))
    assert found.get("PRACTICUM_JUDGE_CONTEXT_TOKENS") == "2048" and "PRACTICUM_JUDGE_AUTO" in found, found
    return found


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def step_done(page, key: str) -> bool:
    return page.locator(f"#step-{key}").get_attribute("data-done") == "true"


@pytest.fixture
def fast_judge(monkeypatch, settings, tiny_talking_server):
    """The FAST demo's judge: the served model, at its server, under the demo's settings; for
    the worker (its environment) and for the pages (this process's settings)."""
    env = {
        **demo_judge_env(),
        "PRACTICUM_JUDGE_BASE_URL": f"{tiny_talking_server.url}/v1",
        "PRACTICUM_JUDGE_MODEL": tiny_talking_server.served_name,
        # The demo's settings send the server's own key to a judge at the inference URL.
        "PRACTICUM_JUDGE_API_KEY": tiny_talking_server.api_key,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
        setting = name.removeprefix("PRACTICUM_")
        current = getattr(settings, setting)
        if isinstance(current, bool):
            setattr(settings, setting, value.lower() in ("1", "true", "yes", "on"))
        else:
            setattr(settings, setting, type(current)(value) if current is not None else value)
    return env


@pytest.fixture
def worker(monkeypatch, tmp_path, fast_judge, gateway):
    """One worker on every queue (judge calls, training, evaluation, release, the agent)."""
    # The agent the tour runs again goes to the configured gateway, as in production.
    monkeypatch.setenv("PRACTICUM_GATEWAY_URL", gateway.url)
    monkeypatch.setenv("PRACTICUM_TRAINING_DIR", str(tmp_path / "training"))
    monkeypatch.setenv("PRACTICUM_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # Messages an earlier, interrupted run left on the broker must not reach this worker.
    subprocess.run(
        [sys.executable, "-m", "celery", "-A", "webapp", "purge", "-f", "-Q", "default,deploy,training"],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    with celery_worker("default,deploy,training") as name:
        yield name


def test_the_whole_tour_in_the_browser(open_page, screenshot, settings, tiny_talking_base, gateway, fast_judge, worker):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    from feedback.demo.agent import demo_agent_run
    from feedback.services.api_keys import api_key_create
    from training.serving.services import live_version_set

    settings.DEMO_AGENT_EPISODES = 2
    operator, approver = user_with_role("operator", "olga"), user_with_role("approver", "arno")
    deployment = DeploymentFactory(name="support-bot")
    base_version = ModelVersion.objects.get(name=tiny_talking_base.name)
    live_version_set(deployment=deployment, version=base_version)

    # The agent works: its traces arrive through the gateway, as `make demo` has it do.
    key = api_key_create(deployment=deployment, scopes=["ingest", "feedback"]).plaintext
    first_run = demo_agent_run(base_url=gateway.url, api_key=key, split="train", episodes=3, seed=1)
    # And, as `make demo` does next, the base on the test tasks the tour's rerun will play.
    demo_agent_run(base_url=gateway.url, api_key=key, split="test", episodes=2, seed=0)
    gateway.drain()
    assert Trace.objects.filter(deployment=deployment, model_version=base_version).count() == 5

    page = open_page(operator)
    page.goto("/tour/")
    assert step_done(page, "traces") and not step_done(page, "comment")
    assert page.inner_text("#tour-live") == tiny_talking_base.name
    screenshot(page, "tour-start", full_page=True)

    # 1. Browse: the trace list shows the agent's conversations.
    page.click("#step-traces a:has-text('Trace list')")
    # Waits through locators: every page runs under a CSP without 'unsafe-eval', which a
    # polled wait_for_function string would need.
    page.locator("a.trace-link").nth(4).wait_for()
    assert page.locator("a.trace-link").count() == 5

    # 2. Comment on the last assistant turn of a trace.
    page.goto("/tour/")
    page.click("#step-comment a:has-text('Open a trace')")
    page.wait_for_url(re.compile(r"/traces/\d+/"))
    trace = Trace.objects.get(pk=int(re.search(r"/traces/(\d+)/", page.url).group(1)))
    assert trace.metadata["split"] == "train"  # never a test task: those measure the candidate
    turn = trace.messages.filter(role="assistant").order_by("-position").first()
    box = page.locator(f"#comments-{turn.position}")
    box.locator("summary:has-text('Comment')").click()
    box.locator("textarea[name=body]").fill("It refunded <b>without</b> looking the order up.")
    box.locator("button:has-text('Add comment')").click()
    box = page.locator(f"#comments-{turn.position}")
    box.locator(".comment-body").wait_for()
    assert Comment.objects.get(message=turn).author == operator

    # 3. The judge turns the comment into a rubric and a reward. The FAST demo judges by hand
    # (PRACTICUM_JUDGE_AUTO=false): the tour says to press "Judge this turn"; the worker asks the
    # served model, whose structured output is the one judgement it was fitted to give.
    assert fast_judge["PRACTICUM_JUDGE_AUTO"] == "false" and not JudgeResult.objects.filter(message=turn).exists()
    page.goto("/tour/")
    assert "Judge this turn" in page.inner_text("#step-judge")
    page.goto(f"/traces/{trace.pk}/")
    judged = page.locator(f"#judge-{turn.position}")
    judged.locator("button:has-text('Judge this turn')").click()
    # The result arrives in place (the block polls while the judgement runs).
    page.locator(f"#judge-{turn.position} .badge.reward").wait_for(timeout=120_000)
    result = JudgeResult.objects.get(message=turn, is_latest=True)
    assert (result.status, result.requested_by) == (JudgeStatus.SUCCEEDED, operator), result.error
    # The tiny model was fitted on two other comments and tasks: what it answers this one
    # varies with the task the agent drew, but structured output keeps it a judgement.
    assert 0.0 <= result.reward <= 1.0 and result.rubric["criteria"], result.raw_output
    judged = page.locator(f"#judge-{turn.position}")
    criterion = result.rubric["criteria"][0]["criterion"]
    assert f"reward {result.reward:.2f}" in judged.inner_text() and criterion in judged.inner_text()
    assert judged.locator(".badge.unverified").count() == 1  # a judge no agreement gate has passed
    page.goto("/tour/")
    assert step_done(page, "comment") and step_done(page, "judge")

    # 4. Build a training set from the commented traces: the tour's link fills the filter in.
    page.click("#step-training_set a:has-text('Training')")
    assert page.input_value("#set-form input[name=filters]") == f"comment=yes&deployment={deployment.pk}"
    page.fill("#set-form input[name=name]", "tour-refunds")
    page.fill("#set-form input[name=heldout_fraction]", "0")
    page.click("#set-form button[type=submit]")
    # The judge's rubric is in it, and no rated turns calibrate the judge: its gate is closed.
    assert "training gate is closed" in page.locator("ul.error").inner_text()
    page.fill("#set-form input[name=judge_gate_override_reason]", "The tour: one turn, read by hand")
    page.click("#set-form button[type=submit]")
    page.wait_for_url(re.compile(r"/training/jobs/\?built=\d+"))
    training_set = TrainingSet.objects.get(name="tour-refunds")
    assert training_set.train_count == 1

    # 5. Start the tour's job, self-distillation on the comment, and watch it finish: a LoRA
    # over the live base, which greets, so the candidate passes the release's smoke test.
    page.goto("/tour/")
    page.click("#step-job a:has-text('Training')")
    assert page.input_value("select[name=kind]") == "distill"
    page.select_option("select[name=base_version]", str(base_version.pk))
    page.select_option("select[name=training_set]", str(training_set.pk))
    for name, value in [("steps", "2"), ("prompts_per_step", "1"), ("max_new_tokens", "8")]:
        page.fill(f"input[name={name}]", value)
    page.fill("textarea[name=config]", '{"eval_every": 0, "samples_per_prompt": 2}')
    page.click("#job-form button[type=submit]")
    try:
        page.wait_for_url(re.compile(r"/training/jobs/\d+/$"), timeout=60_000)
    except PlaywrightTimeout:
        raise AssertionError(f"no job page: at {page.url}; {page.locator('ul.error').all_inner_texts()}") from None
    job = TrainingJob.objects.get()
    wait_until(lambda: TrainingJob.objects.get(pk=job.pk).status not in ("queued", "running"), 240, "the job")
    job.refresh_from_db()
    assert job.status == WorkStatus.FINISHED, (job.status, job.error)
    candidate = job.result_version
    assert candidate is not None and candidate.parent == base_version
    page.reload()
    screenshot(page, "training-job", full_page=True)
    page.goto("/tour/")
    assert step_done(page, "job") and candidate.name in page.inner_text("#step-job")

    # 6. Evaluate the candidate against the live version on the commented trace.
    page.click("#step-evaluate a:has-text('Models')")
    page.select_option("select[name=candidate]", candidate.name)
    page.select_option("select[name=deployment]", "support-bot")
    page.fill("input[name=trace_ids]", str(trace.pk))
    page.fill("input[name=max_tokens]", "16")
    page.click("button:has-text('Evaluate')")
    page.wait_for_url(re.compile(r"/evaluations/\d+/$"))
    page.wait_for_selector("#evaluation-status:has-text('Finished')", timeout=180_000)
    # The served judge is asked to score both versions' answers under the comment's rubric.
    # The FAST model was fitted to one turn judgement, not to scoring candidates: under the
    # schema it runs to its token limit, and the page says so in words, with the way out.
    item = EvaluationItem.objects.get(evaluation__candidate=candidate)
    assert item.rubric == result.rubric
    assert "reward" not in item.candidate and "cut off at its token limit" in item.judge_error, item.judge_error
    evaluation_url = page.url
    page.click(f"a:has-text('{item.key}')")
    said = page.inner_text("dd.error")
    assert "cut off at its token limit" in said and "connect a stronger judge" in said
    page.goto(evaluation_url)

    # 7. The operator requests the promotion; the approver approves; the release goes live.
    page.click("text=Request promotion →")
    page.fill("#id_note", "Looks the order up before refunding.")
    if job.flagged:  # a monitor on two steps of a random model is no verdict; say so
        page.fill("#id_breach_override_reason", "two-step job on the tiny test model")
    page.click("button:has-text('Request promotion')")
    page.wait_for_selector("#promotion-status:has-text('Waiting for approval')")
    promotion = PromotionRequest.objects.get()
    review = open_page(approver)
    review.goto("/tour/")
    review.click("#step-promote a:has-text('The request')")
    review.fill("textarea[name=comment]", "Checks the order first now.")
    review.click("#approve")
    review.click("#confirm-approve")
    review.wait_for_selector("#promotion-status:has-text('Deployed')", timeout=120_000)
    promotion.refresh_from_db()
    assert (promotion.status, promotion.decided_by) == (PromotionStatus.DEPLOYED, approver)
    assert AuditEvent.objects.filter(action="promotion_approved", actor=approver).exists()
    assert LiveVersion.objects.get(deployment=deployment).version == candidate

    page.goto("/tour/")
    assert step_done(page, "promote") and page.inner_text("#tour-live") == candidate.name
    assert not step_done(page, "rerun")

    # 8. Run the agent again from the tour: the new version answers, and its traces say so.
    page.click("#run-agent")
    page.wait_for_url(re.compile(r"/tour/\?deployment=support-bot"))
    assert "2 test tasks" in page.inner_text(".flash")
    page.locator("#step-rerun[data-done='true']").wait_for(timeout=180_000)
    new_traces = Trace.objects.filter(deployment=deployment, model_version=candidate)
    assert new_traces.exists()
    assert all(t.metadata.get("split") == "test" for t in new_traces)
    assert Trace.objects.filter(model_version=base_version).count() == 5  # the first runs' stay as they were
    # The key made for the run is revoked once the run is over.
    wait_until(
        lambda: ApiKey.objects.filter(name="demo agent run").exclude(revoked_at=None).exists(), 120, "the run to end"
    )
    assert not ApiKey.objects.filter(name="demo agent run", revoked_at=None).exists()
    screenshot(page, "tour", full_page=True)

    page.click("#step-rerun a:has-text('Traces of')")
    page.locator("a.trace-link").first.wait_for()
    page.locator("a.trace-link").first.click()
    page.wait_for_url(re.compile(r"/traces/\d+/"))
    assert candidate.name in page.inner_text("main")

    # 9. The overview compares the versions.
    page.goto("/tour/")
    assert step_done(page, "overview")
    assert page.inner_text("#tour-progress").startswith("9 of 9 steps done")
    page.click("#step-overview a")
    assert candidate.name in page.inner_text("main") and base_version.name in page.inner_text("main")
    # The base's test run and the candidate's, paired: one seed, both episodes, and their
    # collateral changes counted from the logged conversations.
    row = page.locator("#measured-support-bot tr.measured-row[data-slice='test']")
    assert candidate.name in row.inner_text() and row.locator(".seeds").inner_text().startswith("1")
    assert "n=2" in row.locator(".paired-gain").inner_text()
    assert row.locator(".base-collateral").inner_text() != "—"
    assert row.locator(".candidate-collateral").inner_text() != "—"
    assert len(first_run.episodes) == 3
