"""Judging through a real Celery worker and a real Redis broker: an operator's comment
posted in the browser, and customer feedback posted to the API, come back judged."""

from __future__ import annotations

import time

import pytest

from feedback.models import JudgeResult, JudgeStatus
from feedback.services.api_keys import api_key_create
from tests.fixtures.judge import Reply
from tests.judge.conftest import VALID_JUDGEMENT

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def judge_worker():
    """A worker thread in this process, so it sees the judge settings a test points at the
    test server (the subprocess worker of tests/fixtures/worker.py would not)."""
    from celery.contrib.testing.worker import start_worker

    from webapp.celery import app

    app.control.purge()  # tasks left by earlier runs in this broker db
    with start_worker(app, pool="solo", queues=["default"], perform_ping_check=False, shutdown_timeout=10) as worker:
        yield worker


def wait_for(predicate, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out waiting for the worker")


def test_a_comment_posted_in_the_browser_is_judged_by_the_worker(
    judge_worker, make_trace, operator, judge_settings, client
):
    judge_settings.script(Reply.json(VALID_JUDGEMENT))
    trace = make_trace()
    client.force_login(operator)
    response = client.post(f"/traces/{trace.pk}/messages/4/comments", {"body": "It guessed the status."})
    assert response.status_code == 302

    result = wait_for(lambda: JudgeResult.objects.filter(status=JudgeStatus.SUCCEEDED).first())
    assert result.reward == pytest.approx(0.2) and result.trigger == "comment"
    assert result.comments.get().body == "It guessed the status."


def test_customer_feedback_posted_to_the_api_is_judged_by_the_worker(
    judge_worker, make_trace, deployment, judge_settings, client
):
    judge_settings.script(Reply.text("{broken"), Reply.json({**VALID_JUDGEMENT, "reward": 0.1}))
    trace = make_trace()
    key = api_key_create(deployment=deployment, scopes=["feedback"]).plaintext
    response = client.post(
        "/api/v1/feedback",
        {"trace_id": trace.pk, "rating": "down", "comment": "Never got my tracking number"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {key}",
    )
    assert response.status_code in (200, 201), response.content

    result = wait_for(lambda: JudgeResult.objects.filter(status=JudgeStatus.SUCCEEDED).first())
    assert result.reward == pytest.approx(0.1) and result.trigger == "customer_feedback"
    assert [a["error"][:18] for a in result.call_attempts] == ["output is not JSON", ""]
