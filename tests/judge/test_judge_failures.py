"""A judgement never stays `running`: a bad answer, any error while it runs, or a worker
that died, each ends with the row failed and the reason written on it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from feedback.models import JudgeResult, JudgeStatus
from feedback.services.judging import judge_results_fail_stale, judge_run, judgement_silent_after
from feedback.services.review import comment_add
from tests.fixtures.judge import Reply
from tests.judge.conftest import VALID_JUDGEMENT
from webapp.kernel.stale_work import stale_work_fail
from webapp.kernel.work import work_claim, work_end

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
    assert "the response is not a chat completion" in result.error
    assert "(after 3 attempts)" in result.error
    assert JudgeResult.objects.get(pk=pending.pk).status == JudgeStatus.FAILED


def test_any_error_while_judging_marks_the_row_failed(pending, judge_settings, monkeypatch):
    import feedback.services.judging as judging

    def broken(**kwargs):
        raise RuntimeError("the prompt could not be built")

    monkeypatch.setattr(judging, "judge_turn", broken)
    result = judge_run(result=pending)
    assert result.status == JudgeStatus.FAILED
    assert result.error == ("the judgement could not be completed: RuntimeError: the prompt could not be built")
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
    assert failed.error.startswith("the worker stopped: no sign of the judgement's worker for 121 s")
    assert "(the limit is 120 s)" in failed.error
    # A later delivery of its task does not undo that.
    judge_settings.script(Reply.json(VALID_JUDGEMENT))
    assert judge_run(result=failed).status == JudgeStatus.FAILED


def test_the_sweep_is_on_celery_beats_schedule():
    from webapp.celery import app

    entries = {entry["task"]: entry for entry in app.conf.beat_schedule.values()}
    assert "webapp.stale_work_sweep" in entries and entries["webapp.stale_work_sweep"]["schedule"] <= 300
    app.loader.import_default_modules()
    assert "webapp.stale_work_sweep" in app.tasks


def test_a_worker_that_resumes_after_the_sweep_does_not_overwrite_the_failure(pending, judge_settings, monkeypatch):
    import feedback.services.judging as judging

    real_judge_turn = judging.judge_turn

    def judge_turn_after_the_sweep(**kwargs):
        # The worker stalls long enough for the sweep to give up on it, then its call returns.
        assert judging.judge_results_fail_stale(now=timezone.now() + timedelta(hours=1)) == [pending.pk]
        return real_judge_turn(**kwargs)

    monkeypatch.setattr(judging, "judge_turn", judge_turn_after_the_sweep)
    judge_settings.script(Reply.json(VALID_JUDGEMENT))
    result = judge_run(result=pending)
    stored = JudgeResult.objects.get(pk=pending.pk)
    assert result.status == stored.status == JudgeStatus.FAILED
    assert stored.error.startswith("the worker stopped: no sign of the judgement's worker")
    assert stored.reward is None and stored.rubric in (None, {}) and not stored.is_latest
    assert stored.trace.judge_reward is None


def test_a_late_failure_does_not_overwrite_the_sweeps_reason(pending, judge_settings, monkeypatch):
    import feedback.services.judging as judging

    real_judge_turn = judging.judge_turn

    def judge_turn_fails_after_the_sweep(**kwargs):
        judging.judge_results_fail_stale(now=timezone.now() + timedelta(hours=1))
        return real_judge_turn(**kwargs)

    monkeypatch.setattr(judging, "judge_turn", judge_turn_fails_after_the_sweep)
    page = Reply.raw(b"<html>busy</html>", content_type="text/html")
    judge_settings.script(page, page, page)
    judge_run(result=pending)
    stored = JudgeResult.objects.get(pk=pending.pk)
    assert stored.status == JudgeStatus.FAILED
    assert stored.error.startswith("the worker stopped: no sign of the judgement's worker")


def test_a_late_result_loses_to_the_worker_that_took_the_judgement_over(pending, judge_settings, monkeypatch):
    """A stale judgement taken over by a redelivered task belongs to that task: the first
    worker's late answer is dropped."""
    import feedback.services.judging as judging

    real_judge_turn = judging.judge_turn

    def judge_turn_after_a_takeover(**kwargs):
        # The first worker falls silent past the limit and a redelivered task takes over.
        silent = timezone.now() - timedelta(hours=1)
        JudgeResult.objects.filter(pk=pending.pk).update(heartbeat_at=silent)
        assert work_claim(JudgeResult, pk=pending.pk, worker="w-next", resume_after=judgement_silent_after())
        return real_judge_turn(**kwargs)

    monkeypatch.setattr(judging, "judge_turn", judge_turn_after_a_takeover)
    judge_settings.script(Reply.json(VALID_JUDGEMENT))
    judge_run(result=pending, worker="w-first")
    stored = JudgeResult.objects.get(pk=pending.pk)
    assert (stored.status, stored.worker, stored.attempts) == (JudgeStatus.RUNNING, "w-next", 2)
    assert stored.reward is None and stored.finished_at is None and not stored.is_latest


def test_a_judgement_is_held_and_swept_by_the_shared_work_lifecycle(pending, judge_settings, settings):
    """The judgement's claim and sweep are the kernel's (webapp/kernel/work.py, stale_work.py):
    a held judgement is refused to a second claim, the kernel's own sweep fails a silent one,
    and the first worker's late end then changes nothing."""
    settings.JUDGE_DEADLINE_S, settings.JUDGE_STALE_GRACE_S = 100, 20
    held = work_claim(JudgeResult, pk=pending.pk, worker="w1", resume_after=judgement_silent_after())
    assert held is not None and (held.status, held.worker, held.attempts) == (JudgeStatus.RUNNING, "w1", 1)

    assert work_claim(JudgeResult, pk=pending.pk, worker="w2", resume_after=judgement_silent_after()) is None
    assert judge_run(result=pending, worker="w3").worker == "w1", "a live worker's judgement is left to it"
    assert judge_settings.requests == []

    assert (
        stale_work_fail(JudgeResult, silent_after=120, now=held.heartbeat_at + timedelta(seconds=119), what="x") == []
    )
    later = held.heartbeat_at + timedelta(seconds=121)
    assert stale_work_fail(JudgeResult, silent_after=120, now=later, what="judgement's worker") == [pending.pk]
    swept = JudgeResult.objects.get(pk=pending.pk)
    assert swept.status == JudgeStatus.FAILED and swept.finished_at == later and "121 s" in swept.error

    ended = work_end(JudgeResult, pk=pending.pk, worker="w1", status=JudgeStatus.SUCCEEDED, error="")
    assert (ended.status, ended.error) == (JudgeStatus.FAILED, swept.error)
    assert work_claim(JudgeResult, pk=pending.pk, worker="w4", resume_after=0) is None, "a failed judgement stays so"
