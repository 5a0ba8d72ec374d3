"""Progressive release at the service level, on hand-built traces: the decision rule (advance,
wait, roll back), each step's audit, hold / advance / roll back by hand, the four eyes that
all traffic takes before the plan is complete, and the plans' validation."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied
from django.utils import timezone

import training.promotion.services.release as release_service
from feedback.models import Message, Trace
from tests.promotion.conftest import evaluation_row, live_moves
from training.promotion.models import AuditAction, AuditEvent, PromotionStatus, Release, ReleaseStep
from training.promotion.rollout_models import ReleasePlan, Rollout, RolloutChange, RolloutState
from training.promotion.services.promotion import promotion_approve, promotion_request_create
from training.promotion.services.promotion_checks import PromotionRefused
from training.promotion.services.release_plans import PlanInvalid, release_plan_create, release_plan_for_approval
from training.promotion.services.rollout_signals import Side, rollout_evaluate, rollout_signals
from training.promotion.services.rollouts import (
    rollout_advance,
    rollout_begin,
    rollout_check,
    rollout_hold,
    rollout_resume,
    rollout_rollback,
    rollouts_tick,
)
from training.serving.models import CanarySplit, LiveVersion
from webapp.kernel.work import WorkStatus, work_claim

STEPS = [
    {"share": 0.05, "min_conversations": 4, "min_minutes": 10},
    {"share": 0.25, "min_conversations": 4, "min_minutes": 10},
    {"share": 1.0, "min_conversations": 0, "min_minutes": 0},
]


@pytest.fixture
def plan(registry):
    return release_plan_create(name="careful", deployment=registry.deployment, steps=STEPS, is_default=True)


@pytest.fixture
def rollout(registry, plan, operator, approver):
    """A rollout whose release has loaded the candidate: at its first step."""
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    promotion = promotion_request_create(
        candidate=registry.candidate, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
    )
    release = promotion_approve(promotion=promotion, user=approver, comment="in steps", plan=plan)
    # The release's worker, past loading and the smoke test, where it would flip the pointer.
    assert work_claim(Release, pk=release.pk, worker="w") is not None
    release = release_service._flip(release, "w")
    assert release.status == WorkStatus.FINISHED and release.step == ReleaseStep.CANARY
    assert not rollout_begin(release=release)  # once only
    return Rollout.objects.get(release=release)


def conversation(deployment, version, at, *, answer="Happy to help.", finish="stop", latency=100.0, rating=None):
    trace = Trace.objects.create(
        deployment=deployment,
        external_id=f"t-{Trace.objects.count()}",
        model_version=version,
        started_at=at,
        feedback_rating=rating,
    )
    Message.objects.create(trace=trace, position=0, role="user", content="Where is my order?", raw={})
    Message.objects.create(
        trace=trace,
        position=1,
        role="assistant",
        content=answer,
        raw={},
        model_version=version,
        finish_reason=finish,
        latency_ms=latency,
        created_at=at,
    )
    return trace


def traffic(registry, rollout, *, candidate=6, live=60, answer="Happy to help.", after=timedelta(minutes=1)):
    at = rollout.step_started_at + after
    for i in range(live):
        conversation(registry.deployment, registry.base_version, at, latency=100.0 + i % 7)
    for i in range(candidate):
        conversation(registry.deployment, registry.candidate, at, answer=answer, latency=100.0 + i % 5)


def test_approval_with_a_plan_routes_the_first_step_and_keeps_the_pointer(registry, rollout, approver):
    assert rollout.state == RolloutState.RUNNING and rollout.step == 0 and rollout.share == 0.05
    split = CanarySplit.objects.get(deployment=registry.deployment)
    assert (split.version, split.share, split.rollout_id) == (registry.candidate, 0.05, rollout.pk)
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version
    assert rollout.release.get_state_display() == "Serving a share of traffic"
    assert len(live_moves(registry.deployment)) == 1  # the fixture's: the pointer stays
    changes = list(rollout.changes.values_list("actor_name", "from_state", "to_state", "to_share"))
    assert changes == [("arno", "", "starting", 0.0), ("automatic", "starting", "running", 0.05)]
    assert rollout.promotion.status == PromotionStatus.APPROVED
    # A restarted inference server loads the candidate beside live; nothing unloads it meanwhile.
    from training.serving.selectors import live_versions_for_base

    assert set(live_versions_for_base(base_model_id=registry.base.pk)) == {registry.base_version, registry.candidate}
    assert release_service.release_adapter_unload(version_id=registry.candidate.pk) == []


def test_a_good_candidate_walks_every_step_by_itself(registry, rollout):
    for expected_share in (0.25, 1.0):
        traffic(registry, rollout)
        now = rollout.step_started_at + timedelta(minutes=11)
        decision = rollout_check(rollout_id=rollout.pk, now=now)
        assert decision.action == "advance", decision.reason
        rollout.refresh_from_db()
        assert rollout.share == expected_share
        # The next step counts only what comes after it began.
        rollout.step_started_at = now
        Rollout.objects.filter(pk=rollout.pk).update(step_started_at=now)
    assert rollout.state == RolloutState.COMPLETE
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.candidate
    assert not CanarySplit.objects.filter(deployment=registry.deployment).exists()
    rollout.promotion.refresh_from_db()
    assert rollout.promotion.status == PromotionStatus.DEPLOYED
    # Going live at the end writes the row every route to live writes, in the pointer's trail.
    assert live_moves(registry.deployment)[1:] == [
        (
            "smol",
            "smol-v1",
            "promotion",
            None,  # the automatic check
            f"progressive release {rollout.pk} complete",
            rollout.promotion_id,
            rollout.release_id,
        )
    ]
    steps = list(rollout.changes.values_list("actor_name", "from_share", "to_share", "to_state"))
    assert steps[-2:] == [("automatic", 0.05, 0.25, "running"), ("automatic", 0.25, 1.0, "complete")]
    assert "every signal at least inconclusive and not worse" in rollout.changes.last().reason
    assert len(rollout.checks) == 2 and rollout.checks[0]["signals"]["empty_rate"][0] == 0.0


def test_the_step_waits_for_its_minimum_of_conversations_and_minutes(registry, rollout):
    traffic(registry, rollout, candidate=3)
    decision = rollout_check(rollout_id=rollout.pk, now=rollout.step_started_at + timedelta(minutes=30))
    assert decision.action == "wait" and "3 of 4 conversations" in decision.reason
    traffic(registry, rollout, candidate=3)
    decision = rollout_check(rollout_id=rollout.pk, now=rollout.step_started_at + timedelta(minutes=5))
    assert decision.action == "wait" and "of 10 minutes" in decision.reason
    rollout.refresh_from_db()
    assert rollout.step == 0 and rollout.last_check["action"] == "wait"


@pytest.mark.redis  # the candidate's unload is queued once the rollback commits
def test_empty_answers_roll_back_at_the_first_step_with_the_reason(
    registry, rollout, operator, approver, mailoutbox, django_capture_on_commit_callbacks
):
    operator.email, approver.email = "olga@example.com", "arno@example.com"
    operator.save()
    approver.save()
    traffic(registry, rollout, candidate=10, answer="\n\n")
    # Before the step's minutes: a regression beyond noise does not wait for them.
    with django_capture_on_commit_callbacks(execute=True):
        decision = rollout_check(rollout_id=rollout.pk, now=rollout.step_started_at + timedelta(minutes=2))
    assert decision.action == "rollback"
    assert [sorted(m.to) for m in mailoutbox] == [["arno@example.com", "olga@example.com"]]
    assert "Empty answers" in mailoutbox[0].body and mailoutbox[0].subject.startswith("Rolled back: smol-v1")
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.ROLLED_BACK and rollout.share == 0.0
    assert "Empty answers 1.000 vs live 0.000" in rollout.reason
    assert not CanarySplit.objects.filter(deployment=registry.deployment).exists()
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version
    last = rollout.changes.last()
    assert (last.actor, last.actor_name, last.from_share, last.to_state) == (None, "automatic", 0.05, "rolled_back")
    assert last.reason.startswith("regressed beyond its threshold: Empty answers")
    assert {s["code"] for s in last.signals if s["status"] == "regressed"} >= {"empty_rate"}
    event = AuditEvent.objects.filter(action=AuditAction.ROLLOUT_CHANGED).first()
    assert "Rolled back" in event.detail and "Empty answers" in event.detail
    rollout.promotion.refresh_from_db()
    assert rollout.promotion.status == PromotionStatus.ROLLED_BACK


def test_a_few_bad_answers_within_noise_wait_instead_of_rolling_back(registry, rollout):
    traffic(registry, rollout, candidate=4)
    traffic(registry, rollout, candidate=1, live=0, answer="")
    decision = rollout_check(rollout_id=rollout.pk, now=rollout.step_started_at + timedelta(minutes=11))
    assert decision.action == "wait" and "within noise" in decision.reason and "Empty answers" in decision.reason


def test_a_held_rollout_is_watched_but_not_advanced_until_resumed(registry, rollout, approver):
    rollout_hold(rollout=rollout, user=approver, reason="watching a complaint")
    traffic(registry, rollout)
    now = rollout.step_started_at + timedelta(minutes=11)
    assert rollouts_tick(now=now) == {rollout.pk: "wait"}
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.HELD and rollout.step == 0
    # The page's signals keep updating while it is held.
    assert rollout.checked_at == now and rollout.last_check["reason"].startswith("held: every signal")
    rollout_resume(rollout=rollout, user=approver)
    assert rollouts_tick(now=rollout.step_started_at + timedelta(minutes=11)) == {rollout.pk: "advance"}
    actors = list(rollout.changes.values_list("actor_name", "to_state", "reason"))
    assert ("arno", "held", "watching a complaint") in actors


def test_all_traffic_before_the_plan_completes_takes_four_eyes(registry, rollout, operator, approver, second_approver):
    from django.contrib.auth.models import Group

    operator.groups.add(Group.objects.get(name="approver"))
    operator = type(operator).objects.get(pk=operator.pk)
    # Every step by hand skips evidence, not only the last: never the requester's own call.
    with pytest.raises(PermissionDenied, match="another approver"):
        rollout_advance(rollout=rollout, user=operator, reason="looks fine")
    rollout_advance(rollout=rollout, user=approver, reason="looks fine")  # 5 % -> 25 %
    with pytest.raises(PermissionDenied, match="another approver"):
        rollout_advance(rollout=rollout, user=operator)
    rollout = rollout_advance(rollout=rollout, user=second_approver, reason="enough seen")
    assert rollout.state == RolloutState.COMPLETE
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.candidate
    assert rollout.changes.last().actor_name == "bea"


def test_a_person_rolls_back_and_nothing_moves_after(registry, rollout, approver, operator):
    with pytest.raises(PermissionDenied):
        rollout_rollback(rollout=rollout, user=operator)
    rollout_rollback(rollout=rollout, user=approver, reason="customer complaints")
    with pytest.raises(PromotionRefused, match="rolled back"):
        rollout_advance(rollout=rollout, user=approver)
    assert RolloutChange.objects.filter(rollout=rollout).last().reason == "customer complaints"
    assert not CanarySplit.objects.exists()


def test_no_other_release_while_one_is_under_way(registry, rollout, approver):
    from training.promotion.services.rollback import rollback_check

    failed = [c for c in rollback_check(deployment=registry.deployment, user=approver) if not c.ok]
    assert any("progressive release" in c.detail for c in failed)


def test_decision_reads_latency_relative_to_live():
    def side(latency, n):
        return Side(
            conversations=n,
            answers=n,
            delivered=n,
            latency_mean=latency,
            latency_sq=latency * latency + 25,
            latency_n=n,
        )

    signals = rollout_signals(deployment=None, cand=side(200.0, 40), live=side(100.0, 400), judge=False)
    latency = next(s for s in signals if s.code == "latency")
    assert latency.delta == pytest.approx(1.0) and latency.ci_high < 1.1
    decision = rollout_evaluate(deployment=None, cand=side(200.0, 40), live=side(100.0, 400), step=STEPS[0], minutes=60)
    assert decision.action == "rollback" and "Latency" in decision.reason


@pytest.mark.parametrize(
    ("steps", "field"),
    [
        ([], "steps"),
        ([{"share": 0.5}], "steps[0].share"),
        ([{"share": 0.5}, {"share": 0.25}, {"share": 1}], "steps[1].share"),
        ([{"share": 0.1, "min_conversations": 2.5}, {"share": 1}], "steps[0].min_conversations"),
        ([{"share": 0.1, "color": "red"}, {"share": 1}], "steps[0]"),
    ],
)
def test_a_plan_with_bad_steps_is_refused_naming_the_entry(registry, steps, field):
    with pytest.raises(PlanInvalid) as caught:
        release_plan_create(name="bad", deployment=registry.deployment, steps=steps)
    assert caught.value.field == field


def test_an_approval_chooses_only_a_plan_offered_to_its_deployment(registry, plan):
    from tests.factories import DeploymentFactory

    other = release_plan_create(name="theirs", deployment=DeploymentFactory(name="other"), steps=[{"share": 1}])
    assert release_plan_for_approval(deployment=registry.deployment, plan_id=str(plan.pk)) == plan
    assert release_plan_for_approval(deployment=registry.deployment, plan_id="") is None
    with pytest.raises(PlanInvalid, match="no plan"):
        release_plan_for_approval(deployment=registry.deployment, plan_id=other.pk)
    with pytest.raises(PlanInvalid):
        release_plan_for_approval(deployment=registry.deployment, plan_id="x")


def test_the_window_is_the_same_hours_for_both_versions(registry, rollout):
    """Conversations from before the step began count for neither side."""
    earlier = rollout.step_started_at - timedelta(hours=1)
    for _ in range(5):
        conversation(registry.deployment, registry.candidate, earlier, answer="")
    traffic(registry, rollout)
    decision = rollout_check(rollout_id=rollout.pk, now=timezone.now() + timedelta(minutes=11))
    assert decision.action == "advance", decision.reason


def test_the_release_page_draws_the_steps_and_escapes_what_it_shows(client, registry, rollout, approver):
    traffic(registry, rollout)
    rollout_check(rollout_id=rollout.pk, now=rollout.step_started_at + timedelta(minutes=11))
    rollout_hold(rollout=rollout, user=approver, reason="<script>alert(1)</script>")
    client.force_login(approver)
    page = client.get(f"/rollouts/{rollout.pk}/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert 'id="rollout-share">25 %' in html and html.count('class="rollout-step') == 3
    assert 'id="chart-share"' in html and 'id="chart-empty_rate"' in html
    assert "every signal at least inconclusive and not worse" in html
    panel = client.get(f"/rollouts/{rollout.pk}/?part=panel").content.decode()
    assert panel.startswith('\n<div id="rollout-panel"') or panel.lstrip().startswith('<div id="rollout-panel"')


def test_the_buttons_and_the_api_call_the_same_rules(client, registry, rollout, operator, approver):
    client.force_login(operator)
    assert client.post(f"/rollouts/{rollout.pk}/hold").status_code == 403
    assert client.post(f"/api/v1/rollouts/{rollout.pk}/hold", {"reason": "x"}).status_code == 403
    client.force_login(approver)
    client.post(f"/rollouts/{rollout.pk}/hold", {"reason": "looking"})
    rollout.refresh_from_db()
    assert rollout.state == RolloutState.HELD
    refused = client.post(f"/api/v1/rollouts/{rollout.pk}/hold", {"reason": "again"}, content_type="application/json")
    assert refused.status_code == 409 and refused.json()["errors"][0]["field"] == "state"
    assert client.post(f"/api/v1/rollouts/{rollout.pk}/dance").status_code == 404
    body = client.post(f"/api/v1/rollouts/{rollout.pk}/rollback", {"reason": "no"}, content_type="application/json")
    assert body.status_code == 200 and body.json()["state"] == "rolled_back"
    assert [c["by"] for c in client.get(f"/api/v1/rollouts/{rollout.pk}").json()["changes"]][-2:] == ["arno", "arno"]


def test_the_api_approves_with_a_plan_and_refuses_a_plan_of_another_deployment(
    client, registry, plan, operator, approver
):
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    promotion = promotion_request_create(
        candidate=registry.candidate, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
    )
    client.force_login(approver)
    bad = client.post(f"/api/v1/promotions/{promotion.pk}/approve", {"plan": "x"}, content_type="application/json")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "plan"
    ok = client.post(
        f"/api/v1/promotions/{promotion.pk}/approve", {"plan": str(plan.pk)}, content_type="application/json"
    )
    assert ok.status_code == 202
    started = Rollout.objects.get(promotion=promotion)
    assert started.plan["steps"] == STEPS
    # The answer names the progressive release to follow, and so does the request's release.
    assert ok.json()["rollout"] == started.pk
    shown = client.get(f"/api/v1/promotions/{promotion.pk}").json()
    assert [r["rollout"] for r in shown["releases"]] == [started.pk]


def test_the_command_creates_and_lists_plans(registry, capsys):
    from django.core.management import CommandError, call_command

    call_command(
        "release_plan", "steady", "--deployment", "support-bot", "--steps", "10:5:1,50:20:5,100", "--default",
        "--threshold", "latency=0.5",
    )  # fmt: skip
    call_command("release_plan", "--list", "--deployment", "support-bot")
    assert "steady\t10 % -> 50 % -> 100 %  (default)" in capsys.readouterr().out
    with pytest.raises(CommandError, match=r"steps\[1\]\.share"):
        call_command("release_plan", "odd", "--steps", "50,25,100")


def test_an_automatic_rollback_is_on_the_approvers_notifications(client, registry, rollout, approver, operator):
    traffic(registry, rollout, candidate=10, answer="")
    rollout_check(rollout_id=rollout.pk, now=rollout.step_started_at + timedelta(minutes=2))
    client.force_login(approver)
    html = client.get("/notifications/").content.decode()
    assert f'id="rollout-news-{rollout.pk}"' in html and "Rolled back" in html and "Empty answers" in html
    client.force_login(operator)
    assert "rollout-news" not in client.get("/notifications/").content.decode()


def test_the_demo_offers_a_short_plan_without_making_it_the_default(registry):
    from django.core.management import call_command

    from training.promotion.services.release_plans import release_plan_default, release_plans_for

    call_command("demo_setup")
    call_command("demo_setup")  # idempotent
    plans = release_plans_for(deployment=registry.deployment)
    assert [p.name for p in plans] == ["demo-steps"] and plans[0].steps[0]["share"] == 0.1
    # The demo's adapter against the bare base on a CPU: latency may double, the rest as default.
    assert plans[0].thresholds == {"latency": 1.0}
    assert release_plan_default(deployment=registry.deployment) is None
    # A data folder of an earlier demo gets the plan as it is now.
    ReleasePlan.objects.filter(pk=plans[0].pk).update(thresholds={}, steps=STEPS)
    call_command("demo_setup")
    (plan,) = release_plans_for(deployment=registry.deployment)
    assert (plan.thresholds, plan.steps[0]["share"]) == ({"latency": 1.0}, 0.1)


def test_approving_from_the_notifications_takes_the_deployments_default_plan(
    client, registry, plan, operator, approver
):
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    promotion = promotion_request_create(
        candidate=registry.candidate, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
    )
    client.force_login(approver)
    asked = client.post(f"/notifications/promotions/{promotion.pk}/approve").content.decode()
    assert 'id="approval-plan"' in asked and "careful" in asked and "Approve: send 5 %" in asked
    token = asked.split('name="confirm" value="')[1].split('"')[0]
    client.post(f"/notifications/promotions/{promotion.pk}/approve", {"confirm": token})
    assert Rollout.objects.get(promotion=promotion).plan["name"] == "careful"


def _advanced_by_the_check(registry, rollout) -> Rollout:
    traffic(registry, rollout)
    assert rollout_check(rollout_id=rollout.pk, now=rollout.step_started_at + timedelta(minutes=11)).action == "advance"
    rollout.refresh_from_db()
    assert rollout.share == 0.25
    return rollout


def test_advance_and_hold_are_refused_once_the_release_moved_past_what_was_seen(registry, rollout, approver):
    """The check moved 5 % -> 25 %; "advance" meant 25 %, not all traffic."""
    rollout = _advanced_by_the_check(registry, rollout)
    for act in (rollout_advance, rollout_hold):
        with pytest.raises(PromotionRefused, match="moved to 25 % since you loaded the page") as caught:
            act(rollout=rollout, user=approver, reason="go to 25 %", seen_step=0)
        assert caught.value.field == "step" and "you saw 5 %" in str(caught.value)
    with pytest.raises(PromotionRefused, match="moved to 25 %") as caught:
        rollout_advance(rollout=rollout, user=approver, seen_share=0.05)
    assert caught.value.field == "share"
    rollout.refresh_from_db()
    assert (rollout.state, rollout.step) == (RolloutState.RUNNING, 1)
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version
    # What was seen is where it is: the move is made.
    rollout_hold(rollout=rollout, user=approver, seen_step=1, seen_share=0.25)
    assert rollout_advance(rollout=rollout, user=approver, seen_step=1).state == RolloutState.COMPLETE


def test_a_rollback_is_not_refused_for_a_step_it_did_not_see(registry, rollout, approver):
    rollout = _advanced_by_the_check(registry, rollout)
    assert rollout_rollback(rollout=rollout, user=approver, seen_step=0).state == RolloutState.ROLLED_BACK


def test_the_page_and_the_api_send_the_step_they_showed(client, registry, rollout, approver):
    client.force_login(approver)
    html = client.get(f"/rollouts/{rollout.pk}/").content.decode()
    assert '<input type="hidden" name="step" value="0">' in html and 'name="share" value="0.05"' in html
    rollout = _advanced_by_the_check(registry, rollout)
    # The page loaded at 5 % posts that; the release is at 25 % now.
    page = client.post(f"/rollouts/{rollout.pk}/advance", {"step": "0", "share": "0.05", "reason": "go"}, follow=True)
    assert "moved to 25 % since you loaded the page" in page.content.decode()
    url = f"/api/v1/rollouts/{rollout.pk}/advance"
    missing = client.post(url, {"reason": "go"}, content_type="application/json")
    assert missing.status_code == 400 and missing.json()["errors"][0]["field"] == "step"
    stale = client.post(url, {"step": 0}, content_type="application/json")
    assert stale.status_code == 409 and stale.json()["errors"][0]["field"] == "step"
    assert "moved to 25 % since you loaded the page" in stale.json()["errors"][0]["reason"]
    assert client.post(url, {"step": 9}, content_type="application/json").status_code == 400
    assert client.post(url, {"share": "NaN"}, content_type="application/json").status_code == 400
    assert client.post(f"/rollouts/{rollout.pk}/advance", {"step": "x"}).status_code == 302
    rollout.refresh_from_db()
    assert (rollout.state, rollout.step) == (RolloutState.RUNNING, 1)
    # The panel redrawn since says the release moved; the form is not in it.
    panel = client.get(f"/rollouts/{rollout.pk}/?part=panel&seen_step=0&seen_state=running").content.decode()
    assert 'id="rollout-moved"' in panel and 'name="reason"' not in panel
    assert 'id="rollout-moved"' not in client.get(f"/rollouts/{rollout.pk}/").content.decode()
    done = client.post(url, {"step": 1, "share": 0.25}, content_type="application/json")
    assert done.status_code == 200 and done.json()["state"] == "complete"


def test_the_api_approves_with_the_deployments_default_plan_unless_told_all_at_once(
    client, registry, plan, operator, approver
):
    def pending():
        evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
        return promotion_request_create(
            candidate=registry.candidate, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
        )

    client.force_login(approver)
    promotion = pending()
    assert (
        client.post(f"/api/v1/promotions/{promotion.pk}/approve", {}, content_type="application/json").status_code
        == 202
    )
    assert Rollout.objects.get(promotion=promotion).plan["name"] == "careful"
    Release.objects.filter(promotion=promotion).update(status=WorkStatus.FAILED)
    Rollout.objects.filter(promotion=promotion).update(state=RolloutState.FAILED)
    promotion = pending()
    body = {"plan": None, "comment": "all at once"}
    assert (
        client.post(f"/api/v1/promotions/{promotion.pk}/approve", body, content_type="application/json").status_code
        == 202
    )
    assert not Rollout.objects.filter(promotion=promotion).exists()


def test_the_release_reads_as_its_rollout_ended(registry, rollout, approver):
    rollout_rollback(rollout=rollout, user=approver, reason="complaints")
    release = Release.objects.get(pk=rollout.release_id)
    assert (release.state, release.get_state_display()) == ("rolled_back", "Rolled back")


def test_a_complete_rollouts_release_reads_live(registry, rollout, approver):
    rollout_advance(rollout=rollout, user=approver, seen_step=0)
    rollout_advance(rollout=rollout, user=approver, seen_step=1)
    release = Release.objects.get(pk=rollout.release_id)
    assert (release.state, release.get_state_display()) == ("live", "Live")


def test_a_rollback_by_hand_is_not_news_of_an_automatic_one(client, registry, rollout, approver):
    rollout_rollback(rollout=rollout, user=approver, reason="by hand")
    client.force_login(approver)
    assert f'id="rollout-news-{rollout.pk}"' not in client.get("/notifications/").content.decode()


@pytest.mark.parametrize(
    ("steps", "field"),
    [("5:nan:1,100", r"steps\[0\]\.min_conversations"), ("5:1e400,100", r"steps\[0\]\.min_conversations"),
     ("5:1:inf,100", r"steps\[0\]\.min_minutes"), ("nan,100", r"steps\[0\]\.share"), ("5:1:1:1,100", "at most")],
)  # fmt: skip
def test_the_command_names_a_step_field_that_is_not_a_finite_number(registry, steps, field):
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=field):
        call_command("release_plan", "odd", "--steps", steps)


def test_the_promotion_page_polls_at_the_release_pages_pace_while_a_rollout_runs(client, rollout, approver):
    client.force_login(approver)
    html = client.get(f"/promotions/{rollout.promotion_id}/").content.decode()
    assert 'hx-trigger="every 2s"' in html and "every 1s" not in html


def test_the_command_prints_each_step_as_it_happens_until_the_release_ends(registry, rollout, capsys):
    from django.core.management import CommandError, call_command

    call_command("rollout_watch", "--deployment", "support-bot", "--once", "--checks")
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0]
        == f"progressive release {rollout.pk}: smol -> smol-v1 for support-bot, plan careful (5 % -> 25 % -> 100 %)"
    )
    assert out[1].endswith("arno       approved by arno with plan careful")
    assert "automatic  starting 0 % -> running 5 %: the candidate is loaded" in out[2]
    assert out[-1].startswith("Running at 5 %")

    for _ in range(2):
        traffic(registry, rollout)
        now = rollout.step_started_at + timedelta(minutes=11)
        rollout_check(rollout_id=rollout.pk, now=now)
        Rollout.objects.filter(pk=rollout.pk).update(step_started_at=now)
        rollout.refresh_from_db()
    # Not --once: it follows the release, and ends with it.
    call_command("rollout_watch", str(rollout.pk), "--checks", "--every", "0.2", "--timeout", "30")
    out = capsys.readouterr().out
    assert "automatic  running 5 % -> running 25 %: every signal at least inconclusive and not worse" in out
    assert "automatic  running 25 % -> complete 100 %: every signal" in out
    assert "check      at 25 %: advance — every signal" in out
    assert out.splitlines()[-1].startswith("Complete at 100 %")
    with pytest.raises(CommandError, match="no progressive release of nope yet"):
        call_command("rollout_watch", "--deployment", "nope")
