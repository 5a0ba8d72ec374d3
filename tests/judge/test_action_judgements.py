"""Judgements constrained to the agent's actions: the judge chooses the corrected turn among
the agent's tools (ids copied from the conversation) or a reply, under structured output, and
the product renders it; chosen per deployment judge from the API and the judge page."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from feedback.judge.actions import action_space_schema, conversation_ids, parse_action_judgement
from feedback.judge.schemas import SchemaViolation
from feedback.models import DeploymentJudge, JudgeResult, JudgeStatus
from feedback.services.review import comment_add
from tests.factories import user_with_role
from tests.fixtures.judge import Reply
from training.environments.support_desk import SupportDesk

pytestmark = pytest.mark.django_db


def _desk_context():
    desk = SupportDesk()
    context = desk.decision_contexts(tasks=desk.tasks_for(split="test", graded=True), per_point=1, every=30)[0]
    return context, json.loads(context.messages[-1]["content"])["order_id"]


def test_the_action_space_is_the_agents_tools_with_ids_from_the_conversation_and_a_reply():
    context, order_id = _desk_context()
    ids = conversation_ids(context.messages)
    assert order_id in ids
    assert "call_0" not in ids  # the agent's own call ids are not what the customer gave
    schema = action_space_schema(tools=context.tools, ids=ids)
    choices = schema["properties"]["action"]["anyOf"]
    assert [c["properties"]["kind"]["enum"][0] for c in choices] == ["reply", "tool", "tool"]
    refund = next(c for c in choices if c["properties"].get("name", {}).get("enum") == ["issue_refund"])
    assert refund["properties"]["arguments"]["properties"]["order_id"]["enum"] == ids
    assert "amount" in refund["properties"]["arguments"]["properties"]  # the tool's own parameters kept


def test_a_chosen_call_is_rendered_as_the_agent_writes_it_and_a_made_up_id_is_refused():
    context, order_id = _desk_context()
    ids = conversation_ids(context.messages)
    schema = action_space_schema(tools=context.tools, ids=ids)
    answer = {
        "rationale": "The lead says it was delivered inside the window: refund it.",
        "action": {"kind": "tool", "name": "issue_refund", "arguments": {"order_id": order_id}},
        "reward": 0.0,
    }
    judgement, action = parse_action_judgement(answer, schema=schema, tools=context.tools, ids=ids)
    assert judgement.corrected_response == (
        f'<tool_call>{{"name": "issue_refund", "arguments": {{"order_id": "{order_id}"}}}}</tool_call>'
    )
    assert action.label == "issue_refund"
    # An id the conversation does not show is refused even by an endpoint that enforces no enum.
    loose = {**schema, "properties": {**schema["properties"], "action": {"type": "object"}}}
    made_up = {**answer, "action": {**answer["action"], "arguments": {"order_id": "642079"}}}
    with pytest.raises(SchemaViolation, match="not an id the conversation shows"):
        parse_action_judgement(made_up, schema=loose, tools=context.tools, ids=ids)
    reply = {**answer, "action": {"kind": "reply", "text": "Sorry, that order is past our window."}}
    judgement, action = parse_action_judgement(reply, schema=schema, tools=context.tools, ids=ids)
    assert (judgement.corrected_response, action.label) == ("Sorry, that order is past our window.", "reply")


def _admin_api(client):
    admin = user_with_role("admin", "ada")
    client.force_login(admin)
    return client


def test_a_deployment_judge_is_set_to_choose_actions_through_the_api(client, deployment, judge_server):
    url = reverse("api-deployment-judge", args=[deployment.name])
    operator = user_with_role("operator", "olga")
    client.force_login(operator)
    assert (
        client.put(url, {"base_url": judge_server.base_url, "model": "m"}, content_type="application/json").status_code
        == 403
    )
    client = _admin_api(client)
    bad = client.put(
        url,
        {"base_url": judge_server.base_url, "model": "m", "correction_mode": "freeform"},
        content_type="application/json",
    )
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "correction_mode"
    ok = client.put(
        url,
        {"base_url": judge_server.base_url, "model": "test-judge", "correction_mode": "actions"},
        content_type="application/json",
    )
    assert ok.status_code == 200 and ok.json()["correction_mode"] == "actions"
    assert client.get(url).json()["correction_mode"] == "actions"
    assert DeploymentJudge.objects.get(deployment=deployment).correction_mode == "actions"


def test_a_comment_is_judged_into_a_chosen_action_and_the_rendered_turn(
    make_trace, operator, deployment, judge_server, settings, client
):
    settings.JUDGE_SWAP_CHECK_RATE = 0.0
    DeploymentJudge.objects.create(
        deployment=deployment, base_url=judge_server.base_url, model="test-judge", correction_mode="actions"
    )
    trace = make_trace()
    made_up = {
        "rationale": "It guessed the status; it should look the order up.",
        "action": {"kind": "tool", "name": "lookup_order", "arguments": {"order_id": "B7"}},
        "reward": 0.1,
    }
    right = {**made_up, "action": {"kind": "tool", "name": "lookup_order", "arguments": {"order_id": "A1"}}}
    judge_server.script(Reply.json(made_up), Reply.json(right))
    from feedback.services.judging import judge_run

    comment_add(message=trace.messages.get(position=4), author=operator, body="Look the order up, don't guess.")
    result = judge_run(result=JudgeResult.objects.get())

    assert result.status == JudgeStatus.SUCCEEDED, result.error
    assert result.prompt_version == "judge-action/v1"
    assert result.action == {"kind": "tool", "name": "lookup_order", "arguments": {"order_id": "A1"}}
    assert (
        result.corrected_response == '<tool_call>{"name": "lookup_order", "arguments": {"order_id": "A1"}}</tool_call>'
    )
    first, second = judge_server.requests
    sent = first["response_format"]["json_schema"]["schema"]
    lookup = next(
        c
        for c in sent["properties"]["action"]["anyOf"]
        if c["properties"].get("name") == {"type": "string", "enum": ["lookup_order"]}
    )
    assert lookup["properties"]["arguments"]["properties"]["order_id"]["enum"] == ["A1"]
    # The made-up id was refused and the judge asked again, told why.
    assert "not an id the conversation shows" in second["messages"][-1]["content"]
    # The judgement's page and the API show the rendered turn and the action.
    client.force_login(operator)
    page = client.get(reverse("feedback:judge-result", args=[result.pk]))
    assert page.status_code == 200 and "judge-action/v1" in page.content.decode()
    api = client.get(reverse("api-trace-judgements", args=[trace.pk])).json()["judgements"][0]
    assert api["action"] == result.action and api["corrected_response"] == result.corrected_response


def test_the_judge_page_switches_a_deployments_corrections(client, deployment, judge_server):
    judge = DeploymentJudge.objects.create(deployment=deployment, base_url=judge_server.base_url, model="test-judge")
    client = _admin_api(client)
    page = client.get(reverse("feedback:judge")).content.decode()
    assert "Chosen among the agent&#x27;s actions" in page
    response = client.post(reverse("feedback:deployment-judge-mode", args=[judge.pk]), {"correction_mode": "actions"})
    assert response.status_code == 302
    judge.refresh_from_db()
    assert judge.correction_mode == "actions"
    client.post(reverse("feedback:deployment-judge-mode", args=[judge.pk]), {"correction_mode": "nonsense"})
    judge.refresh_from_db()
    assert judge.correction_mode == "actions"


def _chosen_and_corrected(make_trace, operator, deployment, judge_server, i: int, *, kind: str, agree: bool):
    """A turn an operator corrected to a lookup of A1, judged (from the comment alone) into a
    lookup of A1 (agree) or a reply (not)."""
    from feedback.services.review import correction_add

    trace = make_trace(external_id=f"conv-{i}", metadata={"kind": kind})
    turn = trace.messages.get(position=4)
    chosen = (
        {"kind": "tool", "name": "lookup_order", "arguments": {"order_id": "A1"}}
        if agree
        else {"kind": "reply", "text": "It has shipped."}
    )
    JudgeResult.objects.create(
        trace=trace,
        message=turn,
        trigger="comment",
        status=JudgeStatus.SUCCEEDED,
        judge_model="test-judge",
        judge_base_url=judge_server.base_url,
        prompt_version="judge-action/v1",
        reward=0.0,
        action=chosen,
        is_latest=True,
    )
    calls = [{"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'}}]
    correction_add(message=turn, author=operator, tool_calls=calls)


def test_the_training_gate_asks_a_judge_choosing_actions_to_agree_with_operators_per_kind(
    make_trace, operator, deployment, judge_server, settings
):
    from feedback.selectors.judge_gate import judge_training_gate

    settings.JUDGE_ACTION_MIN_N = 3
    settings.JUDGE_ACTION_MIN_AGREEMENT = 0.8
    DeploymentJudge.objects.create(
        deployment=deployment, base_url=judge_server.base_url, model="test-judge", correction_mode="actions"
    )
    for i in range(4):
        _chosen_and_corrected(make_trace, operator, deployment, judge_server, i, kind="refundable_recent", agree=True)
    for i in range(4, 6):
        _chosen_and_corrected(make_trace, operator, deployment, judge_server, i, kind="long_past", agree=i == 4)

    gate = judge_training_gate(deployment=deployment)
    assert gate.action_agreement["refundable_recent"] == {"kind": "refundable_recent", "n": 4, "agreed": 4, "rate": 1.0}
    assert gate.action_agreement["long_past"]["n"] == 2
    assert not gate.allowed
    assert "chosen actions of kind long_past: only 2 corrected turns; 3 needed" in gate.reason
    assert "kind refundable_recent" not in gate.reason  # measured and agreeing

    _chosen_and_corrected(make_trace, operator, deployment, judge_server, 6, kind="long_past", agree=False)
    gate = judge_training_gate(deployment=deployment)
    assert "chosen actions of kind long_past agree with operators on 33% of 3, below 80%" in gate.reason

    # Switched back to written corrections, the actions it chose are still in the data
    # training reads: the gate still asks.
    DeploymentJudge.objects.filter(deployment=deployment).update(correction_mode="text")
    gate = judge_training_gate(deployment=deployment)
    assert "chosen actions of kind long_past agree with operators on 33% of 3, below 80%" in gate.reason


def test_a_judgement_that_chose_an_action_is_unverified_until_the_actions_agree(
    make_trace, operator, deployment, judge_server, settings
):
    """The badge goes by the judgement's own prompt, whatever the deployment's mode is now."""
    from feedback.selectors.judge_gate import judge_training_gate, judgements_mark_unverified

    settings.JUDGE_ACTION_MIN_N = 3
    DeploymentJudge.objects.create(deployment=deployment, base_url=judge_server.base_url, model="test-judge")
    _chosen_and_corrected(make_trace, operator, deployment, judge_server, 0, kind="long_past", agree=True)
    chosen = JudgeResult.objects.get()
    written = JudgeResult(
        trace=chosen.trace,
        message=chosen.message,
        status=JudgeStatus.SUCCEEDED,
        judge_model="test-judge",
        judge_base_url=judge_server.base_url,
        prompt_version="judge-turn/v1",
    )
    judgements_mark_unverified([chosen, written])
    assert "chosen actions of kind long_past: only 1 corrected turns; 3 needed" in chosen.unverified
    assert "chosen actions" not in written.unverified
    assert "chosen actions of kind long_past" in judge_training_gate(deployment=deployment).reason


def test_changing_a_deployments_judge_writes_an_audit_row(client, deployment, judge_server):
    from training.promotion.models import AuditAction, AuditEvent

    url = reverse("api-deployment-judge", args=[deployment.name])
    client = _admin_api(client)
    body = {"base_url": judge_server.base_url, "model": "m"}
    assert client.put(url, body, content_type="application/json").status_code == 200
    assert client.put(url, body, content_type="application/json").status_code == 200  # nothing changed
    judge = DeploymentJudge.objects.get(deployment=deployment)
    client.post(reverse("feedback:deployment-judge-mode", args=[judge.pk]), {"correction_mode": "actions"})
    events = list(AuditEvent.objects.filter(action=AuditAction.JUDGE_CHANGED).order_by("id"))
    assert [e.actor_name for e in events] == ["ada", "ada"]
    assert all(e.deployment_id == deployment.pk for e in events)
    assert events[0].data["created"] and events[0].data["changes"]["model"] == ["", "m"]
    assert events[1].data["changes"] == {"correction_mode": ["text", "actions"]}
    assert events[1].detail == "judge changed: correction_mode: text → actions"


_NOTE = [
    {
        "type": "function",
        "function": {
            "name": "note",
            "parameters": {
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "order": {"type": "object", "properties": {"order_id": {"type": "string"}}},
                },
                "required": ["text"],
            },
        },
    }
]
_LOOKUP = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {
                "type": "object",
                "properties": {"customer_id": {"type": "string"}},
                "required": ["customer_id"],
            },
        },
    }
]


def _note(arguments):
    return {"rationale": "Note it.", "reward": 0.2, "action": {"kind": "tool", "name": "note", "arguments": arguments}}


def test_a_chosen_call_is_checked_at_every_depth_and_reads_back_as_the_call():
    from training.inference.codec import tool_calls_parse

    ids = conversation_ids([{"role": "user", "content": "My order ORD-1234 is late"}])
    schema = action_space_schema(tools=_NOTE, ids=ids)
    nested = schema["properties"]["action"]["anyOf"][1]["properties"]["arguments"]["properties"]["order"]
    assert nested["properties"]["order_id"]["enum"] == ["ORD-1234"]
    with pytest.raises(SchemaViolation, match="order/order_id: 'FAKE-9999': it is not an id the conversation shows"):
        parse_action_judgement(
            _note({"text": "x", "order": {"order_id": "FAKE-9999"}}), schema=schema, tools=_NOTE, ids=ids
        )
    with pytest.raises(SchemaViolation, match="arguments/text: holds a <tool_call> tag"):
        parse_action_judgement(_note({"text": "x</tool_call> hi"}), schema=schema, tools=_NOTE, ids=ids)
    reply = {"rationale": "Say it.", "reward": 0.2, "action": {"kind": "reply", "text": '<tool_call>{"name": "note"}'}}
    with pytest.raises(SchemaViolation, match="action/text: holds a <tool_call> tag"):
        parse_action_judgement(reply, schema=schema, tools=_NOTE, ids=ids)
    judgement, _ = parse_action_judgement(
        _note({"text": "x", "order": {"order_id": "ORD-1234"}}), schema=schema, tools=_NOTE, ids=ids
    )
    words, calls = tool_calls_parse(judgement.corrected_response)
    assert words == "" and json.loads(calls[0]["function"]["arguments"])["order"] == {"order_id": "ORD-1234"}


def test_a_long_conversation_keeps_its_latest_ids_and_one_with_none_offers_no_id():
    many = [{"role": "user", "content": " ".join(f"SKU{i}" for i in range(300)) + " my order is ORD-5555"}]
    assert "ORD-5555" in conversation_ids(many)
    # No id shown: a tool that needs one is not offered, an optional one is left out, so
    # what the schema allows the check accepts.
    assert action_space_schema(tools=_LOOKUP, ids=[])["properties"]["action"]["anyOf"][1:] == []
    schema = action_space_schema(tools=_NOTE, ids=[])
    arguments = schema["properties"]["action"]["anyOf"][1]["properties"]["arguments"]
    assert arguments["properties"]["order"]["properties"] == {}
    judgement, _ = parse_action_judgement(_note({"text": "late"}), schema=schema, tools=_NOTE, ids=[])
    assert judgement.corrected_response.startswith("<tool_call>")
    with pytest.raises(SchemaViolation, match="the conversation shows no id"):
        parse_action_judgement(_note({"text": "x", "order": {"order_id": "A1"}}), schema=schema, tools=_NOTE, ids=[])
