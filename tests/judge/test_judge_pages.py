"""The judge's pages, the backfill job, and what a trace page shows of judgements."""

from __future__ import annotations

import pytest

from feedback.models import JudgeJob, JudgeResult, JudgeStatus
from feedback.services.judge_jobs import judge_job_cancel, judge_job_create, judge_job_run
from feedback.services.review import comment_add
from feedback.tasks import judge_job_run_task
from tests.factories import DeploymentFactory, user_with_role
from tests.fixtures.judge import Reply, user_prompt
from tests.judge.conftest import VALID_JUDGEMENT
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db


def commented_traces(make_trace, operator, n: int):
    traces = [make_trace(external_id=f"conv-{i}", answer=f"Answer number {i}.") for i in range(n)]
    for t in traces:
        comment_add(message=t.messages.get(position=4), author=operator, body=f"Wrong answer {t.external_id}")
    JudgeResult.objects.all().delete()  # the comments queued judgements; this test judges in a batch
    return traces


def test_backfill_judges_feedback_turns_and_counts_progress(make_trace, operator, judge_settings):
    commented_traces(make_trace, operator, 5)

    def answer(request):
        if "conv-3" in user_prompt(request):
            return Reply.text("not json")
        return Reply.json(VALID_JUDGEMENT)

    judge_settings.respond_with(answer)
    job = judge_job_create(created_by=operator, limit=100)
    judge_job_run_task(job.pk)
    job.refresh_from_db()
    assert (job.status, job.total, job.succeeded, job.failed) == (WorkStatus.FINISHED, 5, 4, 1)
    assert job.percent == 100
    failed = JudgeResult.objects.get(status=JudgeStatus.FAILED)
    assert failed.trace.external_id == "conv-3" and "not JSON" in failed.error

    # A second backfill of unjudged turns only retries the failed one.
    judge_settings.respond_with(lambda request: Reply.json(VALID_JUDGEMENT))
    again = judge_job_create(created_by=operator)
    judge_job_run(job=again)
    again.refresh_from_db()
    assert (again.total, again.succeeded) == (1, 1)
    assert JudgeResult.objects.filter(status=JudgeStatus.FAILED).count() == 1  # the old failure is kept


def test_a_cancelled_job_stops_and_a_redelivered_job_resumes(make_trace, operator, judge_settings):
    commented_traces(make_trace, operator, 3)
    judge_settings.respond_with(lambda request: Reply.json(VALID_JUDGEMENT))
    job = judge_job_create(created_by=operator)
    assert judge_job_cancel(job=job).status == WorkStatus.CANCELLED
    judge_job_run(job=job)
    assert judge_settings.requests == []

    job = judge_job_create(created_by=operator)
    # A worker died after the first turn: one result done, one left running.
    plan_job = JudgeJob.objects.get(pk=job.pk)
    judge_job_run(job=plan_job)
    assert len(judge_settings.requests) == 3
    JudgeJob.objects.filter(pk=job.pk).update(status=WorkStatus.RUNNING, succeeded=1)
    JudgeResult.objects.filter(job=job).exclude(
        pk=JudgeResult.objects.filter(job=job).order_by("id").first().pk
    ).delete()
    judge_job_run(job=JudgeJob.objects.get(pk=job.pk))
    job.refresh_from_db()
    assert job.status == WorkStatus.FINISHED and job.succeeded == 3
    assert len(judge_settings.requests) == 5  # only the two missing turns were judged again


def test_a_cancel_racing_the_worker_start_is_neither_undone_nor_lost(make_trace, operator, judge_settings):
    commented_traces(make_trace, operator, 2)
    judge_settings.respond_with(lambda request: Reply.json(VALID_JUDGEMENT))

    # The worker loaded the queued job; the operator cancels before it starts.
    job = judge_job_create(created_by=operator)
    as_the_worker_loaded_it = JudgeJob.objects.get(pk=job.pk)
    assert judge_job_cancel(job=job).status == WorkStatus.CANCELLED
    assert judge_job_run(job=as_the_worker_loaded_it).status == WorkStatus.CANCELLED
    assert judge_settings.requests == [] and not JudgeResult.objects.filter(job=job).exists()

    # The page still shows the job queued, but the worker has started it: the cancel is a
    # request the worker honours, not a status its finish would overwrite.
    job = judge_job_create(created_by=operator)
    JudgeJob.objects.filter(pk=job.pk).update(status=WorkStatus.RUNNING, message_ids=[], total=0)
    cancelled = judge_job_cancel(job=job)
    assert (cancelled.status, cancelled.cancel_requested) == (WorkStatus.RUNNING, True)


def test_trace_page_shows_the_judgement_escaped_and_the_judge_button(make_trace, operator, judge_settings, client):
    trace = make_trace()
    comment_add(message=trace.messages.get(position=4), author=operator, body="wrong")
    evil = {**VALID_JUDGEMENT, "rationale": "<script>alert('x')</script> bad", "corrected_response": "<b>Fixed</b>"}
    judge_settings.script(Reply.json(evil))
    from feedback.services.judging import judge_run

    result = judge_run(result=JudgeResult.objects.get())
    client.force_login(operator)
    html = client.get(f"/traces/{trace.pk}/").content.decode()
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; bad" in html
    assert "<script>alert" not in html
    assert "Corrected response, written by the judge" in html and "&lt;b&gt;Fixed&lt;/b&gt;" in html
    assert f"/judge/results/{result.pk}/" in html
    assert "Judge again" in html

    detail = client.get(f"/judge/results/{result.pk}/").content.decode()
    assert "judge-turn/v2" in detail and "Attempt 1" in detail and "&lt;script&gt;" in detail

    response = client.post(f"/traces/{trace.pk}/messages/4/judge", {"next": f"/traces/{trace.pk}/"})
    assert response.status_code == 302
    assert JudgeResult.objects.filter(trigger="manual", status=JudgeStatus.PENDING).count() == 1


def test_judge_overview_lists_jobs_and_failures_and_polls_while_running(make_trace, operator, judge_settings, client):
    commented_traces(make_trace, operator, 1)
    client.force_login(operator)
    response = client.post("/judge/jobs", {"limit": "10", "only_unjudged": "on"})
    assert response.status_code == 302
    job = JudgeJob.objects.get()
    page = client.get("/judge/").content.decode()
    assert f'id="job-{job.id}"' in page and 'hx-trigger="every 2s"' in page
    part = client.get("/judge/?part=jobs", HTTP_HX_REQUEST="true").content.decode()
    assert part.lstrip().startswith('<tbody id="jobs"')

    judge_settings.script(Reply.text("oops"), Reply.text("oops"), Reply.text("oops"))
    judge_job_run(job=job)
    page = client.get("/judge/").content.decode()
    assert "output is not JSON" in page and 'hx-trigger="every 2s"' not in page


def test_only_roles_that_may_spend_judge_calls_start_them(make_trace, judge_settings, client):
    reviewer = user_with_role("reviewer", "rita")
    client.force_login(reviewer)
    assert client.post("/judge/jobs", {"limit": "10"}).status_code == 403
    assert client.get("/judge/").status_code == 403  # reviewers do not browse traces
    approver = user_with_role("approver", "abe")
    client.force_login(approver)
    assert client.get("/judge/agreement/").status_code == 200
    assert client.post("/failure-modes/runs", {"max_traces": "10"}).status_code == 403


def test_bad_backfill_input_is_reported_not_stored(operator, judge_settings, client):
    client.force_login(operator)
    response = client.post("/judge/jobs", {"limit": "0", "since": "2026-01-02"})
    body = response.content.decode()
    # Named by its label and linked to its field; the other values stay as they were.
    assert response.status_code == 400
    assert '<a href="#id_limit">Limit</a>: Ensure this value is greater than or equal to 1.' in body
    assert 'value="2026-01-02"' in body and 'aria-invalid="true"' in body
    assert JudgeJob.objects.count() == 0

    response = client.post("/failure-modes/runs", {"max_traces": "many"})
    body = response.content.decode()
    assert response.status_code == 400 and 'value="many"' in body
    assert '<a href="#id_max_traces">' in body and "Enter a whole number." in body


def test_trace_judgements_api_lists_every_version_in_pinned_queries(
    make_trace, deployment, operator, judge_settings, client, django_assert_num_queries
):
    from feedback.models import JudgeTrigger
    from feedback.services.api_keys import api_key_create
    from feedback.services.judging import judge_request, judge_run

    trace = make_trace()
    answer = trace.messages.get(position=4)
    comment_add(message=answer, author=operator, body="wrong")
    judge_settings.script(Reply.json(VALID_JUDGEMENT), Reply.text("bad"), Reply.text("bad"), Reply.text("bad"))
    judge_run(result=JudgeResult.objects.get())
    judge_run(result=judge_request(message=answer, trigger=JudgeTrigger.MANUAL, enqueue=False))
    key = api_key_create(deployment=deployment, scopes=["read"]).plaintext

    # key lookup, trace, judgements, their messages, comments, customer feedback; then the
    # agreement gate once per distinct judge (the traces' deployments, and five for the gate)
    with django_assert_num_queries(11):
        data = client.get(f"/api/v1/traces/{trace.pk}/judgements", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    newest, oldest = data["judgements"]
    assert newest["status"] == "failed" and newest["reward"] is None and "after 3 attempts" in newest["failure_reason"]
    assert oldest["status"] == "succeeded" and oldest["is_latest"] and oldest["reward"] == 0.2
    assert oldest["corrected_response_author"] == "judge"
    assert oldest["comment_ids"] == [answer.comments.get().pk]
    other = api_key_create(deployment=DeploymentFactory(name="other"), scopes=["read"]).plaintext
    assert client.get(f"/api/v1/traces/{trace.pk}/judgements", HTTP_AUTHORIZATION=f"Bearer {other}").status_code == 404
