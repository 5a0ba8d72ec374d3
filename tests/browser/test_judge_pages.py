"""The judge's pages in real headless Chromium: a backfill job's progress updates in place,
and the trace page shows the judgement under the turn."""

from __future__ import annotations

import pytest

from feedback.models import JudgeJob, Trace
from feedback.services.ingest import traces_ingest
from feedback.services.judge_jobs import judge_job_run
from feedback.services.review import comment_add
from tests.factories import user_with_role
from tests.feedback.conftest import TOOLS, tool_conversation
from tests.fixtures.judge import Reply
from tests.judge.conftest import VALID_JUDGEMENT
from training.serving.services import deployment_get_or_create
from webapp.kernel.work import WorkStatus

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_backfill_progress_updates_in_place_and_the_judgement_shows_on_the_trace(open_page, judge_settings, screenshot):
    deployment = deployment_get_or_create(name="support-bot")
    items = [
        {"external_id": f"conv-{i}", "tools": TOOLS, "messages": tool_conversation(answer="It has shipped.")}
        for i in range(3)
    ]
    traces_ingest(deployment=deployment, items=items)
    operator = user_with_role("operator", "olga")
    for trace in Trace.objects.all():
        comment_add(message=trace.messages.get(position=4), author=operator, body="No tracking number given.")

    page = open_page(operator)
    page.goto("/judge/")
    page.fill("#id_limit", "10")
    page.click("button:has-text('Start backfill')")
    page.wait_for_selector("text=Backfill job")
    job = JudgeJob.objects.get()
    assert page.locator(f"#job-{job.id} .status").inner_text() == "Queued"

    judge_settings.respond_with(lambda request: Reply.json(VALID_JUDGEMENT))
    judge_job_run(job=job)  # what the worker does
    assert JudgeJob.objects.get().status == WorkStatus.FINISHED
    # The jobs table polls while a job is active: it turns to Done without a reload.
    page.wait_for_selector(f"#job-{job.id} .status:has-text('Finished')", timeout=10_000)
    assert "3/3" in page.locator(f"#job-{job.id}").inner_text()
    page.reload()
    assert page.locator("td:has-text('Backfill batch')").count() == 3
    screenshot(page, "judge-overview")

    trace = Trace.objects.get(external_id="conv-0")
    page.goto(f"/traces/{trace.pk}/")
    judge = page.locator("#judge-4")
    assert "reward 0.20" in judge.inner_text()
    assert "Looks up the order before answering" in judge.inner_text()
    assert "Corrected response, written by the judge" in judge.inner_text()

    page.goto("/judge/agreement/")
    assert "test-judge" in page.inner_text("table.agreement")
    screenshot(page, "judge-agreement")
