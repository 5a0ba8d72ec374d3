"""A judgement never stays `running`: a bad answer, any error while it runs, or a worker
that died, each ends with the row failed and the reason written on it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from feedback.models import JudgeResult, JudgeStatus
from feedback.services.judging import judge_results_fail_stale, judge_run
from feedback.services.review import comment_add
from tests.fixtures.judge import Reply
from tests.judge.conftest import VALID_JUDGEMENT

pytestmark = pytest.mark.django_db

COMMENT = "It guessed: the status must come from lookup_order."


@pytest.fixture
def pending(make_trace, operator, judge_settings):
    trace = make_trace()
    comment_add(message=trace.messages.get(position=4), author=operator, body=COMMENT)
    return JudgeResult.objects.get()


def test_a_proxys_html_page_with_status_200_fails_the_judgement_with_the_reason(pending, judge_settings):
    page = Reply.raw(b"<html><body>Service temporarily unavailable</body></html>", content_type="text/html")
    judge_settings.script(page, page, Reply.raw(b'{"id": "chatcmpl-1", "choices": [{"ind'))
    result = judge_run(result=pending)
    assert result.status == JudgeStatus.FAILED and result.reward is None
    assert "the response is not a chat completion" in result.failure_reason
    assert "(after 3 attempts)" in result.failure_reason
    assert JudgeResult.objects.get(pk=pending.pk).status == JudgeStatus.FAILED


def test_any_error_while_judging_marks_the_row_failed(pending, judge_settings, monkeypatch):
    import feedback.services.judging as judging

    def broken(**kwargs):
        raise RuntimeError("the prompt could not be built")

    monkeypatch.setattr(judging, "judge_turn", broken)
    result = judge_run(result=pending)
    assert result.status == JudgeStatus.FAILED
    assert result.failure_reason == (
        "the judgement could not be completed: RuntimeError: the prompt could not be built"
    )
    assert result.reward is None and result.finished_at is not None


def test_the_sweep_fails_judgements_a_dead_worker_left_running(pending, judge_settings, settings):
    settings.JUDGE_DEADLINE_S = 100
    settings.JUDGE_STALE_GRACE_S = 20
    now = timezone.now()
    JudgeResult.objects.filter(pk=pending.pk).update(
        status=JudgeStatus.RUNNING, started_at=now - timedelta(seconds=119)
    )
    assert judge_results_fail_stale(now=now) == []  # could still be within its deadline
    assert JudgeResult.objects.get(pk=pending.pk).status == JudgeStatus.RUNNING

    later = now + timedelta(seconds=2)
    assert judge_results_fail_stale(now=later) == [pending.pk]
    failed = JudgeResult.objects.get(pk=pending.pk)
    assert failed.status == JudgeStatus.FAILED and failed.reward is None
    assert failed.failure_reason.startswith("the worker stopped while judging: running for 121 s")
    # A later delivery of its task does not undo that.
    judge_settings.script(Reply.json(VALID_JUDGEMENT))
    assert judge_run(result=failed).status == JudgeStatus.FAILED


def test_the_sweep_is_on_celery_beats_schedule():
    from webapp.celery import app

    entries = {entry["task"]: entry for entry in app.conf.beat_schedule.values()}
    assert "feedback.judge_fail_stale" in entries and entries["feedback.judge_fail_stale"]["schedule"] <= 300
    app.loader.import_default_modules()
    assert "feedback.judge_fail_stale" in app.tasks
