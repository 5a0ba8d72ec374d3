"""The agreement page and API, and the training gate, on stored ratings and judgements."""

from __future__ import annotations

import pytest

from feedback.judge.prompts import CURRENT_TURN
from feedback.models import JudgeResult, JudgeStatus, TurnRating
from feedback.selectors.judge import agreement_by_version, judge_reward_gate
from feedback.services.api_keys import api_key_create
from tests.factories import MessageFactory, TraceFactory, user_with_role

pytestmark = pytest.mark.django_db


def rated_turn(
    deployment, user, *, human: tuple[str, int], reward: float | None, model="judge-a", version=CURRENT_TURN.version
):
    trace = TraceFactory(deployment=deployment)
    MessageFactory(trace=trace, position=0, role="user", content="Where is A1?")
    answer = MessageFactory(trace=trace, position=1, role="assistant", content="It shipped.")
    TurnRating.objects.create(trace=trace, message=answer, user=user, kind=human[0], value=human[1])
    if reward is not None:
        JudgeResult.objects.create(
            trace=trace,
            message=answer,
            trigger="manual",
            status=JudgeStatus.SUCCEEDED,
            judge_model=model,
            prompt_version=version,
            reward=reward,
            is_latest=True,
        )
    return answer


def seed(deployment, user, *, agree_pass: int, agree_fail: int, judge_only_pass: int, human_only_pass: int, **kw):
    for _ in range(agree_pass):
        rated_turn(deployment, user, human=("thumbs", 1), reward=0.9, **kw)
    for _ in range(agree_fail):
        rated_turn(deployment, user, human=("thumbs", -1), reward=0.1, **kw)
    for _ in range(judge_only_pass):
        rated_turn(deployment, user, human=("thumbs", -1), reward=0.8, **kw)
    for _ in range(human_only_pass):
        rated_turn(deployment, user, human=("thumbs", 1), reward=0.2, **kw)


@pytest.fixture
def operator(db):
    return user_with_role("operator", "olga")


def test_kappa_per_version_and_the_training_gate(deployment, operator, settings):
    settings.JUDGE_MODEL = "judge-a"
    settings.JUDGE_BASE_URL = "http://judge.invalid/v1"
    # 18 pass/pass, 14 fail/fail, 4 + 4 disagreements: p_o = 0.8; both say pass 22/40,
    # p_e = 0.55^2 + 0.45^2 = 0.505 -> kappa = 0.295 / 0.495 = 0.596 (just under 0.6).
    seed(deployment, operator, agree_pass=18, agree_fail=14, judge_only_pass=4, human_only_pass=4)
    (row,) = agreement_by_version()
    assert row.pass_fail.value == pytest.approx(0.295 / 0.495)
    assert row.pass_fail.n == 40 and row.percent_agreement == pytest.approx(0.8)
    assert row.confusion == {"pass/pass": 18, "fail/fail": 14, "pass/fail": 4, "fail/pass": 4}
    assert row.pass_fail.low < row.pass_fail.value < row.pass_fail.high
    gate = judge_reward_gate()
    assert not gate.allowed and "below the minimum 0.60" in gate.reason

    # Two more agreeing turns of each kind: p_o = 36/44, margins 24/44 -> kappa = 0.633.
    seed(deployment, operator, agree_pass=2, agree_fail=2, judge_only_pass=0, human_only_pass=0)
    gate = judge_reward_gate()
    assert gate.allowed and gate.n == 44
    assert gate.kappa == pytest.approx(
        (36 / 44 - ((24 / 44) ** 2 + (20 / 44) ** 2)) / (1 - ((24 / 44) ** 2 + (20 / 44) ** 2))
    )

    # Another prompt version is judged on its own, and has too few turns.
    seed(
        deployment,
        operator,
        agree_pass=5,
        agree_fail=5,
        judge_only_pass=0,
        human_only_pass=0,
        version="judge-turn/next",
    )
    gate_v2 = judge_reward_gate(prompt_version="judge-turn/next")
    assert not gate_v2.allowed and "only 10 rated turns" in gate_v2.reason


def test_spearman_on_scores_and_neutral_turns_left_out_of_kappa(deployment, operator):
    # Scores 1..5 against rising rewards: rho = 1. Score 3 is neutral: no pass/fail label.
    for score, reward in [(1, 0.05), (2, 0.3), (3, 0.5), (4, 0.7), (5, 0.95), (5, 0.9), (1, 0.1)]:
        rated_turn(deployment, operator, human=("score", score), reward=reward)
    (row,) = agreement_by_version()
    assert row.scores.n == 7
    assert row.scores.value == pytest.approx(1.0, abs=0.05)  # ties in scores, near-monotone rewards
    assert row.pass_fail.n == 6
    assert row.weighted_kappa.value > 0.8


def test_only_the_latest_judgement_per_turn_counts(deployment, operator):
    answer = rated_turn(deployment, operator, human=("thumbs", 1), reward=0.1)
    JudgeResult.objects.filter(message=answer).update(is_latest=False)
    JudgeResult.objects.create(
        trace=answer.trace,
        message=answer,
        trigger="manual",
        status=JudgeStatus.SUCCEEDED,
        judge_model="judge-a",
        prompt_version=CURRENT_TURN.version,
        reward=0.9,
        is_latest=True,
    )
    (row,) = agreement_by_version()
    assert row.confusion == {"pass/pass": 1}


def test_agreement_page_and_api(deployment, operator, client):
    seed(deployment, operator, agree_pass=3, agree_fail=3, judge_only_pass=1, human_only_pass=0)
    client.force_login(operator)
    page = client.get("/judge/agreement/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "judge-a" in html and CURRENT_TURN.version in html and "blocked" in html

    key = api_key_create(deployment=deployment, scopes=["read"]).plaintext
    data = client.get("/api/v1/judge/agreement", HTTP_AUTHORIZATION=f"Bearer {key}").json()
    (version,) = data["versions"]
    assert data["deployment"] == "support-bot" and data["min_kappa"] == 0.6 and data["min_n"] == 30
    assert version["pass_fail_kappa"]["n"] == 7
    assert version["confusion"]["pass/fail"] == 1
    assert version["training_gate"]["allowed"] is False
    other = client.get("/api/v1/judge/agreement?deployment=other", HTTP_AUTHORIZATION=f"Bearer {key}")
    assert other.status_code == 403 and other.json()["errors"][0]["field"] == "deployment"
    write_only = api_key_create(deployment=deployment, scopes=["ingest"]).plaintext
    assert client.get("/api/v1/judge/agreement", HTTP_AUTHORIZATION=f"Bearer {write_only}").status_code == 403
