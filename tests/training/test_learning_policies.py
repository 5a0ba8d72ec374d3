"""Learning policies through their services: when a policy fires, what its set is built
from, what its requirements decide, and that it never puts anything live."""

from __future__ import annotations

import threading

import pytest
from django.core import mail
from django.db import connection
from django.utils import timezone

from feedback.models import JudgeResult
from feedback.models.judge import JudgeStatus, JudgeTrigger
from tests.factories import MessageFactory, TraceFactory
from tests.training.policies import commented_turns, finish_evaluation, finish_job, policy
from training.learning_policies.models import LearningPolicyRun, LearningPolicyUse, RunOutcome, RunStage
from training.learning_policies.services import PolicyError, learning_policy_update
from training.learning_policies.tick import learning_policies_tick
from training.models import TrainingJob
from training.promotion.models import PromotionRequest, PromotionStatus
from training.serving.models import LiveVersion, LiveVersionChange
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db


def only_run(p) -> LearningPolicyRun:
    (run,) = p.runs.all()
    return run


def test_fires_once_n_new_commented_turns_arrived_and_not_before(world):
    p = policy(world)
    commented_turns(world["deployment"], 2)
    learning_policies_tick()
    learning_policies_tick()
    p.refresh_from_db()
    assert not p.runs.exists()  # waiting leaves no history behind
    assert p.waiting_reason == "2 of 3 commented turns since the last run"

    comments = commented_turns(world["deployment"], 1, start=2)
    learning_policies_tick()
    run = only_run(p)
    assert run.stage == RunStage.TRAINING and run.reason.startswith("3 new commented turns so far")
    assert run.training_set.item_count == 3 and run.training_set.selection["policy"] == p.pk
    assert run.provenance["comments"] == 3 and run.provenance["turns"] == 3
    job = run.job
    assert (job.kind, job.status, job.base_version, job.training_set) == (
        "distill",
        WorkStatus.QUEUED,
        world["base_version"],
        run.training_set,
    )
    assert comments[0].pk in set(p.uses.values_list("object_id", flat=True))


def test_the_next_set_is_built_only_from_comments_no_run_used(world):
    p = policy(world)
    first = commented_turns(world["deployment"], 3)
    learning_policies_tick()
    run = only_run(p)
    TrainingJob.objects.filter(pk=run.job_id).update(status=WorkStatus.FAILED, error="out of memory")
    learning_policies_tick()
    run.refresh_from_db()
    assert run.outcome == RunOutcome.ERROR and "out of memory" in run.error and run.finished_at

    # Old comments do not count again; three new turns fire the next run on them alone.
    commented_turns(world["deployment"], 2, start=10)
    learning_policies_tick()
    assert p.runs.count() == 1
    second_batch = commented_turns(world["deployment"], 1, start=12)
    learning_policies_tick()
    latest = p.runs.order_by("-id").first()
    assert latest.pk != run.pk
    items = list(latest.training_set.items.all())
    assert sorted(i.key.rsplit(":", 2)[1] for i in items) == ["conv-10", "conv-11", "conv-12"]
    used_first = set(LearningPolicyUse.objects.filter(run=run).values_list("object_id", flat=True))
    used_second = set(LearningPolicyUse.objects.filter(run=latest).values_list("object_id", flat=True))
    assert used_first == {c.pk for c in first} and used_first.isdisjoint(used_second)
    assert second_batch[0].pk in used_second


def test_a_failing_evaluation_opens_no_request_and_records_why(world):
    p = policy(world)
    commented_turns(world["deployment"], 3)
    learning_policies_tick()
    run = only_run(p)
    candidate = finish_job(run, world)
    learning_policies_tick()
    run.refresh_from_db()
    assert run.stage == RunStage.EVALUATING
    evaluation = run.evaluation
    assert (evaluation.candidate, evaluation.baseline) == (candidate, world["base_version"])
    assert evaluation.training_set == world["eval_set"] and evaluation.status == WorkStatus.QUEUED

    learning_policies_tick()  # still running: nothing changes
    run.refresh_from_db()
    assert run.stage == RunStage.EVALUATING and run.finished_at is None

    finish_evaluation(run, win_rate=0.55, ci_low=0.2)
    learning_policies_tick()
    run.refresh_from_db()
    assert run.outcome == RunOutcome.CHECKS_FAILED
    assert "Win rate vs live ≥ 0.60: win rate 0.55 over 3 items" in run.error
    assert "lower bound 0.20" in run.error
    failed = {c["code"] for c in run.checks if not c["ok"]}
    assert failed == {"win_rate", "win_rate_ci_low"}
    assert not PromotionRequest.objects.exists()


def test_a_passing_run_opens_a_request_that_waits_for_an_approver_and_nothing_goes_live(
    world, client, django_capture_on_commit_callbacks, settings
):
    settings.SITE_URL = "https://practicum.example.com"
    live_before = list(LiveVersion.objects.values_list("deployment_id", "version_id"))
    changes_before = LiveVersionChange.objects.count()
    p = policy(world)
    commented_turns(world["deployment"], 3)
    learning_policies_tick()
    run = only_run(p)
    candidate = finish_job(run, world)
    learning_policies_tick()
    run.refresh_from_db()
    finish_evaluation(run, win_rate=0.9, ci_low=0.6, n=9)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        learning_policies_tick()
    run.refresh_from_db()
    assert run.outcome == RunOutcome.REQUESTED and run.error == ""
    promotion = run.promotion
    assert promotion.status == PromotionStatus.PENDING and promotion.candidate == candidate
    assert promotion.requested_by == world["olga"] and promotion.evaluation == run.evaluation
    evidence = promotion.snapshot["learning_policy"]
    assert evidence["run"] == run.pk and evidence["provenance"]["comments"] == 3
    assert all(c["ok"] for c in evidence["checks"]) and promotion.snapshot["evaluation"]["id"] == run.evaluation_id
    assert run.notified == ["arno"]
    assert callbacks and [m.to for m in mail.outbox] == [["arno@example.com"]]
    # The mail takes the approver to the request's notification, where they decide it.
    assert f"https://practicum.example.com/notifications/#promotion-{promotion.pk}" in mail.outbox[0].body

    # More ticks change nothing, and nothing is live until a person approves.
    learning_policies_tick()
    assert p.runs.count() == 1
    assert list(LiveVersion.objects.values_list("deployment_id", "version_id")) == live_before
    assert LiveVersionChange.objects.count() == changes_before

    # The requester cannot approve it; the approver can (the release then goes to a worker).
    client.force_login(world["olga"])
    assert client.post(f"/api/v1/promotions/{promotion.pk}/approve", {}, "application/json").status_code == 403
    client.force_login(world["arno"])
    response = client.post(f"/api/v1/promotions/{promotion.pk}/approve", {"comment": "ok"}, "application/json")
    assert response.status_code == 202, response.json()
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.APPROVED and promotion.decided_by == world["arno"]


def test_a_disabled_policy_does_not_fire_and_the_judge_signal_waits_for_its_gate(world):
    p = policy(world, enabled=False)
    commented_turns(world["deployment"], 3)
    learning_policies_tick()
    assert not p.runs.exists()

    judged = policy(world, name="judge-rewards", signal="judge", min_new_turns=1)
    trace = TraceFactory(deployment=world["deployment"], external_id="judged")
    MessageFactory(trace=trace, position=0, role="user", content="hi")
    turn = MessageFactory(trace=trace, position=1, role="assistant", content="hello")
    JudgeResult.objects.create(
        trace=trace, message=turn, trigger=JudgeTrigger.COMMENT, status=JudgeStatus.SUCCEEDED, is_latest=True
    )
    learning_policies_tick()
    judged.refresh_from_db()
    assert not judged.runs.exists()
    assert judged.waiting_reason.startswith("the judge's training gate is closed")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_ticks_at_once_fire_a_policy_once(world):
    p = policy(world)
    commented_turns(world["deployment"], 3)
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def tick():
        try:
            barrier.wait()
            learning_policies_tick()
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=tick) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    learning_policies_tick()
    assert p.runs.count() == 1 and TrainingJob.objects.count() == 1
    assert LearningPolicyUse.objects.count() == 3


def test_bad_policies_are_refused_with_the_field_and_the_reason(world):
    with pytest.raises(PolicyError) as bad:
        policy(world, job_config={"steps": 0}, min_new_turns=0, min_interval_minutes=0, min_win_rate=2)
    fields = dict(bad.value.errors)
    assert set(fields) == {"job_config.steps", "min_new_turns", "min_win_rate"}
    assert fields["min_new_turns"] == "set a number of new turns or a minimum interval (or both)"
    p = policy(world)
    with pytest.raises(PolicyError, match="job_kind"):
        learning_policy_update(policy=p, user=world["olga"], job_kind="nonsense")
    with pytest.raises(PolicyError, match="already has a policy named fix-lookups"):
        policy(world)


def test_the_minimum_interval_holds_the_next_run_back(world):
    p = policy(world, min_new_turns=1, min_interval_minutes=60)
    commented_turns(world["deployment"], 1)
    learning_policies_tick()
    run = only_run(p)
    TrainingJob.objects.filter(pk=run.job_id).update(status=WorkStatus.FAILED)
    learning_policies_tick()
    commented_turns(world["deployment"], 1, start=5)
    learning_policies_tick()
    p.refresh_from_db()
    assert p.runs.count() == 1 and "the next may fire from" in p.waiting_reason
    learning_policies_tick(now=timezone.now() + timezone.timedelta(minutes=61))
    assert p.runs.count() == 2


def test_the_tick_is_on_celery_beats_schedule_and_expires_with_its_interval():
    from webapp.celery import app

    entries = {entry["task"]: entry for entry in app.conf.beat_schedule.values()}
    tick = entries["training.learning_policies_tick"]
    assert tick["schedule"] <= 300 and tick["options"]["expires"] == tick["schedule"]
    app.loader.import_default_modules()
    assert app.tasks["training.learning_policies_tick"].queue == "default"


def test_an_episodes_policy_learns_each_new_graded_training_episode_once(world):
    from tests.training.test_episode_set_page import logged_episode
    from training.environments.support_desk import SupportDesk

    tasks = SupportDesk().tasks()
    train = [t for t in tasks if t.split == "train" and t.hidden.get("graded")][:3]
    test_task = next(t for t in tasks if t.split == "test" and t.hidden.get("graded"))
    p = policy(world, signal="episodes", environment="support-desk", min_new_turns=2, job_kind="grpo")
    logged_episode(world["deployment"], train[0], "ep-0")
    logged_episode(world["deployment"], test_task, "ep-test")  # a test task never trains
    learning_policies_tick()
    p.refresh_from_db()
    assert not p.runs.exists() and p.waiting_reason == "1 of 2 graded episodes since the last run"

    second = logged_episode(world["deployment"], train[1], "ep-1")
    learning_policies_tick()
    run = only_run(p)
    assert run.reason.startswith("2 new graded episodes so far")
    assert run.provenance["episodes"] == 2 and run.job.kind == "grpo"
    assert {i.trace_id for i in run.training_set.items.all()} == set(
        LearningPolicyUse.objects.filter(run=run).values_list("object_id", flat=True)
    )
    assert second.pk in set(p.uses.values_list("object_id", flat=True))


def test_a_customer_feedback_policy_counts_turns_with_new_customer_feedback(world):
    from feedback.models import CustomerFeedback

    p = policy(world, signal="customer", min_new_turns=2)
    for i in range(2):
        trace = TraceFactory(deployment=world["deployment"], external_id=f"cust-{i}")
        MessageFactory(trace=trace, position=0, role="user", content="Refund A1?")
        turn = MessageFactory(trace=trace, position=1, role="assistant", content="No.")
        CustomerFeedback.objects.create(
            deployment=world["deployment"], trace=trace, message=turn, comment="You never looked it up."
        )
        if i == 0:
            commented_turns(world["deployment"], 3, start=10)  # operators' comments are another signal
            learning_policies_tick()
            assert not p.runs.exists()
    learning_policies_tick()
    run = only_run(p)
    assert (run.provenance["customer_feedback"], run.provenance["turns"], run.provenance["comments"]) == (2, 2, 0)
