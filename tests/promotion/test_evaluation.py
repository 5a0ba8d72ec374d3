"""Evaluations: the figures of the pure metrics, and a whole run of the tiny model's
tool-call adapter against the base weights, generated in-process on the CPU (transformers
and peft) and scored by the scriptable judge."""

from __future__ import annotations

import json
import math

import pytest

from tests.fixtures.adapters import LOOKUP_TOOL
from tests.fixtures.judge import presented_responses
from training.inference.codec import tool_calls_parse
from training.promotion.evaluation.metrics import (
    compare,
    kl_k3,
    response_checks,
    summarize,
    wilson_interval,
)


def test_wilson_interval_matches_a_hand_computation():
    low, high = wilson_interval(8, 10)
    # p = 0.8, z = 1.96: centre = (0.8 + 0.19208) / 1.38415, half = 1.96 * sqrt(0.016 + 0.0009604) / 1.38415
    assert (round(low, 4), round(high, 4)) == (0.4902, 0.9433)
    assert wilson_interval(0, 0) == (None, None)
    low, high = wilson_interval(3, 3)
    assert high == 1.0 and 0.43 < low < 0.44


def test_kl_k3_is_zero_for_identical_models_and_positive_otherwise():
    assert kl_k3([-0.1, -2.0], [-0.1, -2.0]) == 0.0
    value = kl_k3([-0.1, -0.2], [-1.1, -3.2])
    r = [-1.0, -3.0]
    assert math.isclose(value, sum(math.exp(x) - 1 - x for x in r) / 2)
    assert kl_k3([-0.1], [-0.1, -0.2]) is None  # lengths differ: no estimate


def test_response_checks_count_invalid_tool_calls_against_the_schema():
    good = {"id": "1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'}}
    bad_args = {"id": "2", "type": "function", "function": {"name": "lookup_order", "arguments": '{"id": 3}'}}
    unknown = {"id": "3", "type": "function", "function": {"name": "delete_all", "arguments": "{}"}}
    message = {"role": "assistant", "content": None, "tool_calls": [good, bad_args, unknown]}
    checks = response_checks(message, finish_reason="tool_calls", tools=[LOOKUP_TOOL])
    assert (checks["tool_calls_seen"], checks["tool_calls_invalid"], checks["empty"]) == (3, 2, False)
    text, calls = tool_calls_parse(
        'ok <tool_call>{"name": "lookup_order", "arguments": {"order_id": "A1"}}</tool_call>'
    )
    assert text == "ok" and json.loads(calls[0]["function"]["arguments"]) == {"order_id": "A1"}
    broken = response_checks(
        {"role": "assistant", "content": "<tool_call>{not json</tool_call>"}, finish_reason="stop", tools=[]
    )
    assert (broken["tool_calls_seen"], broken["tool_calls_invalid"]) == (1, 1)
    refusal = response_checks(
        {"role": "assistant", "content": "I'm sorry, but I can't help with that."}, finish_reason="length", tools=None
    )
    assert refusal["refusal"] and refusal["truncated"] and not refusal["empty"]


def test_summary_counts_ties_as_half_a_win():
    def side(reward):
        return {"reward": reward, "tokens": 3, "chars": 10, "tool_calls_seen": 0, "tool_calls_invalid": 0}

    items = [
        {"candidate": side(1.0), "baseline": side(0.0), "outcome": compare(1.0, 0.0), "kl": 0.5},
        {"candidate": side(0.5), "baseline": side(0.5), "outcome": compare(0.5, 0.5), "kl": None},
        {"candidate": side(0.0), "baseline": side(1.0), "outcome": compare(0.0, 1.0), "kl": 0.1},
        {"candidate": {"error": "HTTP 500"}, "baseline": side(1.0), "outcome": "", "kl": None},
    ]
    summary = summarize(items)
    c = summary["comparison"]
    assert (c["wins"], c["ties"], c["losses"], c["n"], c["win_rate"]) == (1, 1, 1, 3, 0.5)
    assert summary["candidate"]["errors"] == 1 and summary["candidate"]["n"] == 3
    assert summary["candidate"]["reward_mean"] == 0.5 and summary["baseline"]["reward_mean"] == 0.625
    assert math.isclose(summary["kl"]["mean"], 0.3)


@pytest.fixture
def local_registry(db, tiny_model_path, tool_call_adapter_path):
    from tests.factories import DeploymentFactory
    from training.inference.server import free_port
    from training.serving.services import base_model_register, live_version_set, model_version_create

    base, base_version = base_model_register(
        name="tiny", path=tiny_model_path, inference_url=f"http://127.0.0.1:{free_port()}"
    )
    deployment = DeploymentFactory(name="support-bot")
    live_version_set(deployment=deployment, version=base_version)
    candidate = model_version_create(
        name="tiny-tools", base_model=base, kind="lora", path=tool_call_adapter_path, parent=base_version
    )
    return deployment, base_version, candidate


ITEMS = [
    {
        "key": "order-status",
        "messages": [{"role": "user", "content": "Where is my order A1001?"}],
        "tools": [LOOKUP_TOOL],
        "rubric": {"criteria": [{"criterion": "Looks the order up with lookup_order", "weight": 3}]},
    },
    {
        "key": "refund",
        "messages": [
            {"role": "system", "content": "You are a support agent."},
            {"role": "user", "content": "Refund please"},
        ],
        "tools": [LOOKUP_TOOL],
    },
    {
        "key": "says-tool",
        "messages": [{"role": "user", "content": "hello"}],
        "grader": "contains",
        "reference": "lookup_order",
    },
]


def test_a_local_evaluation_scores_both_versions_side_by_side(local_registry, judge_settings, operator):
    from training.promotion.models import AuditAction, AuditEvent
    from training.promotion.services.evaluation import evaluation_create, evaluation_run
    from webapp.kernel.work import WorkStatus

    deployment, base_version, candidate = local_registry

    def judge(request):
        shown = presented_responses(request)
        return {
            "scores": [
                {
                    "response": i + 1,
                    "reason": f"looked up: {'lookup_order' in text}",
                    "score": 1.0 if "lookup_order" in text else 0.1,
                }
                for i, text in enumerate(shown)
            ]
        }

    judge_settings.respond_with(judge)
    evaluation = evaluation_create(
        candidate=candidate, deployment=deployment, items=ITEMS, created_by=operator, max_tokens=40
    )
    assert evaluation.config["generator"] == "local"  # no server answers at the base's URL
    assert (evaluation.baseline, evaluation.total) == (base_version, 3)

    evaluation = evaluation_run(evaluation_id=evaluation.pk)

    assert evaluation.status == WorkStatus.FINISHED, evaluation.error
    s = evaluation.summary
    # Two turn items go to the judge (the graded task does not), one call per item with both
    # responses — except that the random base model's greedy answer is 40 newlines, which the
    # judge's guard scores 0 without showing it.
    assert len(judge_settings.requests) == 2
    assert all(
        presented_responses(r) == ['[calls tool lookup_order with {"order_id": "A1001"}]']
        for r in judge_settings.requests
    )
    assert (s["candidate"]["reward_mean"], s["baseline"]["reward_mean"]) == (1.0, 0.0)
    assert evaluation.items.get(key="refund").baseline["reason"] == "not judged: empty response"
    assert (s["candidate"]["graded_accuracy"], s["baseline"]["graded_accuracy"]) == (1.0, 0.0)
    assert (s["comparison"]["wins"], s["comparison"]["n"], s["comparison"]["win_rate"]) == (3, 3, 1.0)
    assert 0.43 < s["comparison"]["ci_low"] < 0.44
    # The adapter calls lookup_order everywhere: valid where the item offers the tool, not
    # where it offers none; the random base model calls nothing.
    assert (s["candidate"]["tool_calls"], s["candidate"]["tool_calls_invalid"]) == (3, 1)
    assert s["baseline"]["tool_calls"] == 0
    assert (s["baseline"]["empty_rate"], s["baseline"]["truncated_rate"], s["candidate"]["empty_rate"]) == (
        1.0,
        1.0,
        0.0,
    )
    assert s["kl"]["n"] == 3 and s["kl"]["mean"] > 0.1
    item = evaluation.items.get(key="order-status")
    call = item.candidate["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("lookup_order", {"order_id": "A1001"})
    assert item.candidate["reason"] == "looked up: True" and item.outcome == "win"
    assert list(AuditEvent.objects.filter(evaluation=evaluation).values_list("action", flat=True).order_by("id")) == [
        AuditAction.EVALUATION_STARTED,
        AuditAction.EVALUATION_FINISHED,
    ]
    # A redelivered run finds it finished and leaves it alone.
    assert evaluation_run(evaluation_id=evaluation.pk).summary == s
    assert len(judge_settings.requests) == 2


def test_evaluation_input_is_checked_before_anything_is_stored(local_registry, operator):
    from training.promotion.models import Evaluation
    from training.promotion.services.evaluation import EvaluationError, evaluation_create

    deployment, base_version, candidate = local_registry
    bad = [
        {"messages": []},
        {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]},
        {"messages": [{"role": "user", "content": "x"}], "grader": "vibes", "reference": "z"},
    ]
    with pytest.raises(EvaluationError) as refused:
        evaluation_create(candidate=candidate, deployment=deployment, items=bad, created_by=operator)
    assert [f for f, _ in refused.value.errors] == ["items[0].messages", "items[1].messages", "items[2].grader"]
    with pytest.raises(EvaluationError, match="already live"):
        evaluation_create(candidate=base_version, deployment=deployment, items=ITEMS, created_by=operator)
    with pytest.raises(EvaluationError, match="nothing to evaluate"):
        evaluation_create(candidate=candidate, deployment=deployment, created_by=operator)
    assert not Evaluation.objects.exists()


def test_the_evaluation_api_answers_400_with_fields(client, local_registry, operator, approver):
    client.force_login(operator)
    response = client.post(
        "/api/v1/evaluations",
        {"candidate": "tiny-tools", "deployment": "support-bot", "items": [{"messages": "hi"}]},
        content_type="application/json",
    )
    assert response.status_code == 400
    assert response.json()["errors"] == [
        {"field": "items[0].messages", "reason": "must be a non-empty list of chat messages"}
    ]
    created = client.post(
        "/api/v1/evaluations",
        {"candidate": "tiny-tools", "deployment": "support-bot", "items": ITEMS, "generator": "local"},
        content_type="application/json",
    )
    assert created.status_code == 201
    body = created.json()
    assert (body["status"], body["progress"], body["baseline"]) == ("queued", {"done": 0, "total": 3}, "tiny")
    client.force_login(approver)  # approvers read evaluations but do not start them
    assert client.get(f"/api/v1/evaluations/{body['id']}?items=1").json()["items"][2]["grader"] == "contains"
    assert client.post("/api/v1/evaluations", {}, content_type="application/json").status_code == 403


LOOKUP_A1001 = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "lookup_order", "arguments": '{"order_id": "A1001"}'},
}


def test_a_served_tool_call_is_graded_as_the_call_it_is():
    """A served message carries its call in `tool_calls` (the server parsed the block out of
    the text): the grader reads it back through the same codec, as the call it was."""
    from training.promotion.services.evaluation import _grading_text
    from training.trainer.graders import grade

    served = {"role": "assistant", "content": None, "tool_calls": [LOOKUP_A1001]}
    text = _grading_text(served)
    assert tool_calls_parse(text) == ("", [LOOKUP_A1001])
    assert grade("tool_action", text, '[{"reply": true}]') == 0.0
    assert grade("tool_action", text, '[{"tool": "lookup_order", "arguments": {"order_id": "A1001"}}]') == 1.0
    assert grade("tool_action", text, '[{"tool": "lookup_order", "arguments": {"order_id": "A1002"}}]') == 0.0
    # Words before the call do not turn it into a reply.
    worded = {**served, "content": "Let me look that order up for you."}
    assert grade("tool_action", _grading_text(worded), '[{"reply": true}]') == 0.0
    assert (
        grade(
            "tool_action",
            _grading_text({"role": "assistant", "content": "Your refund is on its way."}),
            '[{"reply": true}]',
        )
        == 1.0
    )


TOOL_GRADED = [
    {
        "key": "should-reply",
        "messages": [{"role": "user", "content": "Where is my order A1001?"}],
        "tools": [LOOKUP_TOOL],
        "grader": "tool_action",
        "reference": '[{"reply": true}]',
    },
    {
        "key": "should-look-up",
        "messages": [{"role": "user", "content": "Where is my order A1001?"}],
        "tools": [LOOKUP_TOOL],
        "grader": "tool_action",
        "reference": '[{"tool": "lookup_order", "arguments": {"order_id": "A1001"}}]',
    },
]


def test_an_evaluation_grades_a_tool_calling_candidate_right_on_both_outcomes(local_registry, operator):
    from training.promotion.services.evaluation import evaluation_create, evaluation_run
    from webapp.kernel.work import WorkStatus

    deployment, _, candidate = local_registry
    evaluation = evaluation_create(
        candidate=candidate, deployment=deployment, items=TOOL_GRADED, created_by=operator, max_tokens=40
    )
    evaluation = evaluation_run(evaluation_id=evaluation.pk)
    assert evaluation.status == WorkStatus.FINISHED, evaluation.error

    reply, look_up = evaluation.items.get(key="should-reply"), evaluation.items.get(key="should-look-up")
    # The candidate calls lookup_order on A1001 in both: wrong where a reply is wanted, right
    # where the look-up is; the random base model does neither.
    assert reply.candidate["message"]["tool_calls"][0]["function"]["name"] == "lookup_order"
    assert (reply.candidate["graded"], look_up.candidate["graded"]) == (0.0, 1.0)
    assert (reply.baseline["graded"], look_up.baseline["graded"]) == (0.0, 0.0)
    assert (reply.outcome, look_up.outcome) == ("tie", "win")
    assert evaluation.summary["candidate"]["graded_accuracy"] == 0.5
