"""The judge's training gate, enforced: calibrated on the prompt training uses (score-
candidates, on rated turns, feedback left out), decided on kappa's lower bound, order-swap
consistency and the judge's failure rate; a closed gate stops judge-scored jobs and judged
training sets unless a person overrides it, and the override is audited. Every
score_candidates call a job makes is stored."""

from __future__ import annotations

import random

import pytest

from feedback.judge.prompts import CURRENT_SCORE, CURRENT_TURN
from feedback.models import CandidateScoring, JudgeResult, JudgeStatus, ScoringPurpose, TurnRating
from feedback.selectors.judge_gate import judge_training_gate
from feedback.services.judge_gate import judge_calibration_run
from tests.factories import MessageFactory, TraceFactory, user_with_role
from tests.fixtures.judge import Reply, presented_responses, user_prompt

pytestmark = pytest.mark.django_db

RUBRIC = {"criteria": [{"criterion": "Looks the order up before answering", "weight": 1}]}


@pytest.fixture
def operator():
    return user_with_role("operator", "olga")


@pytest.fixture
def gate_settings(judge_settings, settings):
    settings.JUDGE_REWARD_MIN_N = 30
    settings.JUDGE_REWARD_MIN_KAPPA = 0.6
    settings.JUDGE_GATE_MIN_SWAP_N = 10
    settings.JUDGE_GATE_MIN_SWAP_AGREEMENT = 0.8
    settings.JUDGE_GATE_MAX_FAILURE_RATE = 0.1
    settings.JUDGE_MAX_ATTEMPTS = 1
    return judge_settings


def rated_turn(deployment, user, *, good: bool, n: int, judged: bool = True):
    """A turn operators rated (thumbs), whose text says which it is, and its judgement."""
    trace = TraceFactory(deployment=deployment)
    MessageFactory(trace=trace, position=0, role="user", content=f"Where is order A{n}?")
    text = f"Let me look up order A{n}: it shipped on Monday." if good else f"No idea about A{n}, sorry."
    answer = MessageFactory(trace=trace, position=1, role="assistant", content=text)
    TurnRating.objects.create(trace=trace, message=answer, user=user, kind="thumbs", value=1 if good else -1)
    if judged:
        JudgeResult.objects.create(
            trace=trace,
            message=answer,
            trigger="manual",
            status=JudgeStatus.SUCCEEDED,
            judge_model="test-judge",
            prompt_version=CURRENT_TURN.version,
            rubric=RUBRIC,
            reward=0.9 if good else 0.1,
            corrected_response=f"Let me look up order A{n} for you.",
            is_latest=True,
        )
    return answer


def honest_judge(wrong_every: int = 0):
    """Scores each shown response by what it says (looking the order up is good); with
    `wrong_every`, every such call gets the opposite score (a judge that disagrees)."""
    calls = {"n": 0}

    def respond(request):
        assert "thumbs" not in user_prompt(request).lower()  # operators' ratings never shown
        calls["n"] += 1
        flip = wrong_every and calls["n"] % wrong_every == 0
        scores = []
        for label, text in enumerate(presented_responses(request), start=1):
            good = "look" in text.lower()
            scores.append(
                {
                    "response": label,
                    "score": (0.1 if good else 0.9) if flip else (0.9 if good else 0.1),
                    "reason": "checked",
                }
            )
        return {"scores": scores}

    return respond


def test_calibration_scores_rated_turns_with_the_training_prompt_and_opens_the_gate(
    deployment, operator, gate_settings
):
    for n in range(20):
        rated_turn(deployment, operator, good=True, n=n)
        rated_turn(deployment, operator, good=False, n=100 + n)
    gate = judge_training_gate(deployment=deployment)
    assert not gate.allowed and "only 0 rated turns scored with score-candidates/v1" in gate.reason

    gate_settings.respond_with(honest_judge())
    counts = judge_calibration_run(deployment=deployment, rng=random.Random(0))
    assert counts == {"scored": 40, "failed": 0, "swap_checks": 40}
    calls = CandidateScoring.objects.filter(purpose=ScoringPurpose.CALIBRATION)
    assert calls.count() == 40
    row = calls.first()
    assert (row.judge_model, row.prompt_version, row.status) == ("test-judge", CURRENT_SCORE.version, "succeeded")
    assert row.raw_output.startswith('{"scores"') and row.attempts and row.message_id is not None
    # The calibration prompt is the one GRPO uses: rubric and candidate, never the feedback.
    first = gate_settings.requests[0]
    assert first["response_format"]["json_schema"]["name"] == "candidate_scores"

    gate = judge_training_gate(deployment=deployment)
    assert gate.allowed, gate.reason
    assert gate.n == 40 and gate.kappa == pytest.approx(1.0) and gate.swap_n == 40
    assert gate.prompt_version == CURRENT_SCORE.version and gate.failure_rate == 0
    # A second run has nothing left to score.
    assert judge_calibration_run(deployment=deployment)["scored"] == 0


def test_pointing_the_judge_elsewhere_under_the_same_model_name_closes_the_gate(deployment, operator, gate_settings):
    """The calibration is evidence about one judge: the model name at one URL. Another server
    answering to the same name (an endpoint edited in the admin) has not been calibrated."""
    from feedback.models import DeploymentJudge

    for n in range(20):
        rated_turn(deployment, operator, good=True, n=n)
        rated_turn(deployment, operator, good=False, n=100 + n)
    gate_settings.respond_with(honest_judge())
    judge_calibration_run(deployment=deployment, rng=random.Random(0))
    assert judge_training_gate(deployment=deployment).allowed

    DeploymentJudge.objects.create(deployment=deployment, base_url="http://judge.elsewhere.test/v1", model="test-judge")
    gate = judge_training_gate(deployment=deployment)
    assert not gate.allowed
    assert "only 0 rated turns scored" in gate.reason and "only 0 order-swap checks" in gate.reason


def test_the_gate_uses_kappas_lower_bound_not_the_point_estimate(deployment, operator, gate_settings):
    for n in range(18):
        rated_turn(deployment, operator, good=True, n=n)
        rated_turn(deployment, operator, good=False, n=100 + n)
    # Every 8th scoring call answers the wrong way round: kappa around 0.7-0.8, but with 36
    # turns its interval reaches well below 0.6.
    gate_settings.respond_with(honest_judge(wrong_every=8))
    judge_calibration_run(deployment=deployment, rng=random.Random(0), swap_checks=False)
    gate = judge_training_gate(deployment=deployment)
    assert gate.kappa >= 0.6 > gate.kappa_low, (gate.kappa, gate.kappa_low)
    assert not gate.allowed
    assert f"95% lower bound {gate.kappa_low:.2f} is below 0.60" in gate.reason
    assert "only 0 order-swap checks; 10 needed" in gate.reason


def test_a_judge_that_fails_often_keeps_the_gate_closed(deployment, operator, gate_settings):
    for n in range(20):
        rated_turn(deployment, operator, good=True, n=n)
        rated_turn(deployment, operator, good=False, n=100 + n)
    gate_settings.respond_with(honest_judge())
    judge_calibration_run(deployment=deployment, rng=random.Random(0))
    assert judge_training_gate(deployment=deployment).allowed
    # Later calls fail: five of them on newly rated turns, stored as failures.
    for n in range(5):
        rated_turn(deployment, operator, good=True, n=300 + n)
    gate_settings.respond_with(lambda request: Reply.error(503))
    assert judge_calibration_run(deployment=deployment)["failed"] == 5
    assert CandidateScoring.objects.filter(status="failed").exclude(failure_reason="").count() == 5
    gate = judge_training_gate(deployment=deployment)
    assert gate.allowed and gate.failure_rate == pytest.approx(5 / 85)  # under 10%: still open
    for n in range(10):
        rated_turn(deployment, operator, good=True, n=400 + n)
    assert judge_calibration_run(deployment=deployment)["failed"] == 15  # the 5 again, and 10 new
    gate = judge_training_gate(deployment=deployment)
    assert not gate.allowed and "the judge failed 20 of 100 calls (20%), over 10%" in gate.reason


# Enforcement --------------------------------------------------------------------------


@pytest.fixture
def judged_set(deployment, operator):
    from training.models import TrainingItemKind
    from training.services.training_sets import training_set_create

    turn = rated_turn(deployment, operator, good=False, n=1)
    return training_set_create(
        name="judged",
        deployment=deployment,
        heldout_fraction=0,
        items=[
            {
                "kind": TrainingItemKind.TURN,
                "key": "turn-1",
                "messages": [{"role": "user", "content": "Where is order A1?"}],
                "rubric": RUBRIC,
                "trace_id": turn.trace_id,
                "message_id": turn.pk,
            }
        ],
    )


@pytest.fixture
def base_version(db, tmp_path):
    from training.serving.models import BaseModel, ModelVersion, ModelVersionKind

    base = BaseModel.objects.create(name="tiny", path=str(tmp_path))
    return ModelVersion.objects.create(
        name="tiny", base_model=base, kind=ModelVersionKind.BASE, path=str(tmp_path), status="live"
    )


def test_a_judge_scored_job_is_refused_while_the_gate_is_closed_and_an_override_is_audited(
    deployment, operator, gate_settings, judged_set, base_version
):
    from training.models import JobEventKind
    from training.promotion.models import AuditAction, AuditEvent
    from training.services.jobs import JobError, training_job_create

    create = {"kind": "grpo", "config": {"steps": 1}, "base_version": base_version, "training_set": judged_set}
    with pytest.raises(JobError) as info:
        training_job_create(**create, user=operator, enqueue=False)
    field, reason = info.value.errors[0]
    assert field == "judge_gate_override_reason"
    assert "training gate is closed" in reason and "only 0 rated turns scored with score-candidates/v1" in reason
    with pytest.raises(JobError, match="needs a logged-in person"):
        training_job_create(**create, judge_gate_override_reason="pilot run", enqueue=False)

    job = training_job_create(
        **create, user=operator, judge_gate_override_reason="pilot on 1 turn, reviewed by hand", enqueue=False
    )
    (event,) = AuditEvent.objects.filter(action=AuditAction.JUDGE_GATE_OVERRIDDEN)
    assert (event.actor, event.deployment) == (operator, deployment)
    assert "pilot on 1 turn, reviewed by hand" in event.detail and event.at is not None
    assert event.data["gate"]["allowed"] is False and "only 0 rated turns" in event.data["gate"]["reason"]
    logged = job.events.filter(kind=JobEventKind.LOG, data__has_key="judge_gate").get()
    assert logged.data["judge_gate"]["override"]["by"] == "olga"


def test_overriding_the_default_judges_gate_for_a_job_of_no_deployment_is_audited_too(
    deployment, operator, gate_settings, base_version
):
    """A set built on the jobs page belongs to no deployment, nor does a base version: the
    job is scored by the settings' judge, and its override is audited on the deployments
    whose conversations it trains on."""
    from training.models import TrainingItemKind
    from training.promotion.models import AuditAction, AuditEvent
    from training.services.jobs import training_job_create
    from training.services.training_sets import training_set_create

    turn = rated_turn(deployment, operator, good=False, n=1)
    item = {"kind": TrainingItemKind.TURN, "key": "t", "messages": [{"role": "user", "content": "A1?"}]}
    unowned = training_set_create(
        name="unowned",
        heldout_fraction=0,
        items=[{**item, "rubric": RUBRIC, "trace_id": turn.trace_id, "message_id": turn.pk}],
    )
    create = {"kind": "grpo", "config": {"steps": 1}, "base_version": base_version, "enqueue": False}
    training_job_create(**create, training_set=unowned, user=operator, judge_gate_override_reason="trust me")
    (event,) = AuditEvent.objects.filter(action=AuditAction.JUDGE_GATE_OVERRIDDEN)
    assert (event.actor, event.deployment, event.data["judge_of"]) == (operator, deployment, None)
    assert "trust me" in event.detail

    # Items of no conversation: the override is audited with no deployment.
    orphan = training_set_create(name="orphan", heldout_fraction=0, items=[{**item, "rubric": RUBRIC}])
    training_job_create(**create, training_set=orphan, user=operator, judge_gate_override_reason="no one's data")
    event = AuditEvent.objects.filter(action=AuditAction.JUDGE_GATE_OVERRIDDEN).latest("id")
    assert (event.actor, event.deployment, event.data["judge_of"]) == (operator, None, None)
    assert "no one's data" in event.detail


def test_a_job_scored_by_graders_only_needs_no_gate(deployment, operator, gate_settings, base_version):
    from training.services.jobs import training_job_create
    from training.services.training_sets import training_set_from_tasks

    tasks = training_set_from_tasks(
        name="graded", tasks=[{"prompt": f"Say A{i}", "reference": "A", "grader": "contains"} for i in range(4)]
    )
    job = training_job_create(
        kind="grpo", config={"steps": 1}, base_version=base_version, training_set=tasks, enqueue=False
    )
    assert job.pk


def test_a_training_set_with_the_judges_output_needs_the_gate_or_an_override(deployment, operator, gate_settings):
    from training.services.feedback_sets import training_set_from_feedback
    from training.services.training_sets import TrainingSetError

    for n in range(3):
        rated_turn(deployment, operator, good=False, n=n)
    with pytest.raises(TrainingSetError) as info:
        training_set_from_feedback(name="fixes", filters={"deployment": deployment.pk}, user=operator)
    assert info.value.errors[0][0] == "judge_gate_override_reason"
    built = training_set_from_feedback(
        name="fixes", filters={"deployment": deployment.pk}, user=operator, judge_gate_override_reason="small pilot"
    )
    assert built.selection["judge_gate"]["override"]["reason"] == "small pilot"
    assert built.items.count() == 3


def test_every_score_candidates_call_a_job_makes_is_stored(deployment, gate_settings, settings):
    from feedback.judge.client import JudgeCallFailed
    from training.services.job_scoring import scorer_for
    from training.trainer.items import TurnItem

    settings.JUDGE_PRICE_INPUT_PER_MTOK, settings.JUDGE_PRICE_OUTPUT_PER_MTOK = 2.0, 8.0
    item = TurnItem(id="turn:1", messages=[{"role": "user", "content": "Where is A1?"}], rubric=RUBRIC)
    score = scorer_for([item], deployment=deployment, job_id=77)
    gate_settings.script(
        Reply.json(
            {"scores": [{"response": 1, "score": 0.2, "reason": "a"}, {"response": 2, "score": 0.8, "reason": "b"}]}
        )
    )
    assert sorted(score(item, ["No idea.", "Let me look up A1."])) == [0.2, 0.8]
    gate_settings.script(Reply.text("not json"))
    with pytest.raises(JudgeCallFailed):
        score(item, ["x", "y"])

    ok, failed = CandidateScoring.objects.filter(training_job_id=77).order_by("id")
    assert (ok.purpose, ok.status, ok.item_key, ok.candidates) == ("training", "succeeded", "turn:1", 2)
    assert (ok.judge_model, ok.prompt_version) == ("test-judge", CURRENT_SCORE.version)
    assert ok.raw_output.startswith('{"scores"') and ok.cost is not None and ok.cost > 0
    assert ok.rubric == RUBRIC and sorted(ok.scores) == [0.2, 0.8] and len(ok.presented) == 2
    assert failed.status == "failed" and "not JSON" in failed.failure_reason and failed.raw_output == "not json"


def test_the_calibrate_command_and_the_agreement_page_show_the_gate(deployment, operator, gate_settings, client):
    from io import StringIO

    from django.core.management import call_command

    for n in range(2):
        rated_turn(deployment, operator, good=n == 0, n=n)
    gate_settings.respond_with(honest_judge())
    out = StringIO()
    call_command("judge_calibrate", "--deployment", deployment.name, stdout=out)
    assert "Scored 2 rated turns (0 failed), 2 order-swap checks." in out.getvalue()
    assert "Training gate: closed — only 2 rated turns scored with score-candidates/v1; 30 needed" in out.getvalue()
    client.force_login(operator)
    page = client.get(f"/judge/agreement/?deployment={deployment.name}").content.decode()
    assert 'id="training-gate"' in page and "only 2 rated turns scored with score-candidates/v1" in page
    api = client.get(f"/api/v1/judge/agreement?deployment={deployment.name}").json()["training_gate"]
    assert api["allowed"] is False and api["n"] == 2 and api["prompt_version"] == CURRENT_SCORE.version


def test_sft_on_the_judges_corrections_needs_the_gate_unless_the_set_passed_it(
    deployment, operator, gate_settings, base_version
):
    from training.models import CorrectionSource, TrainingItemKind
    from training.services.feedback_sets import training_set_from_feedback
    from training.services.jobs import JobError, training_job_create
    from training.services.training_sets import training_set_create

    item = {
        "kind": TrainingItemKind.TURN,
        "key": "turn-1",
        "messages": [{"role": "user", "content": "Where is order A1?"}],
        "corrected_response": "Let me look up order A1.",
        "correction_source": CorrectionSource.JUDGE,
    }
    older = training_set_create(name="older", items=[item], heldout_fraction=0, deployment=deployment)
    with pytest.raises(JobError) as info:
        training_job_create(kind="sft", config={"steps": 1}, base_version=base_version, training_set=older)
    assert info.value.errors[0][0] == "judge_gate_override_reason"
    assert "an SFT job on the judge's corrections" in info.value.errors[0][1]

    # A set built through the gate (here: overridden, audited) trains without a second override.
    rated_turn(deployment, operator, good=False, n=1)
    built = training_set_from_feedback(
        name="fixes",
        filters={"deployment": deployment.pk},
        user=operator,
        judge_gate_override_reason="pilot",
        heldout_fraction=0,  # its one item trains, whatever its id
    )
    assert built.items.filter(correction_source=CorrectionSource.JUDGE).exists()
    assert training_job_create(
        kind="sft", config={"steps": 1}, base_version=base_version, training_set=built, enqueue=False
    ).pk
