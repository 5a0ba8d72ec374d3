"""Grading one turn of a support-desk episode: the `tool_action` grader (by hand), the
actions the hidden policy accepts at each point, and training sets built from logged
episodes (train tasks only, every graded turn with its context)."""

from __future__ import annotations

import json
import re

import pytest

from feedback.demo.agent import ACT_OR_REPLY_REGEX
from feedback.models import Trace, TraceSource
from training.environments import Completion, episode_run
from training.environments.support_desk import SupportDesk, oracle_turns, turn_reference, turn_target
from training.inference.codec import tool_calls_parse
from training.models import TrainingItem
from training.services.episode_sets import episode_turn_items, training_set_from_episodes
from training.trainer.graders import grade, response_action

LOOKUP = '<tool_call>{"name": "lookup_order", "arguments": {"order_id": "A1001"}}</tool_call>'
REFUND = '<tool_call>{"name": "issue_refund", "arguments": {"order_id": "A1001"}}</tool_call>'


def _tasks(*, allowed: bool, split: str = "train") -> list:
    return [t for t in SupportDesk().tasks_for(split=split, graded=True) if t.hidden["refund"] == allowed]


# A refundable training order, and one the policy refuses because it was delivered too long ago.
ALLOWED = _tasks(allowed=True)[0]
LATE = next(
    t
    for t in _tasks(allowed=False)
    if t.hidden["expected"][t.hidden["order_id"]]["status"] == "delivered"
    and SupportDesk().table.row(t.hidden["order_id"])["delivered_days_ago"] is not None
)


@pytest.mark.parametrize(
    ("response", "action"),
    [
        (LOOKUP, {"tool": "lookup_order", "arguments": {"order_id": "A1001"}}),
        (
            '<tool_call>\n{"name": "issue_refund", "arguments": "{\\"order_id\\": \\"A1001\\"}"}',
            {"tool": "issue_refund", "arguments": {"order_id": "A1001"}},
        ),
        ("I have refunded your order.", {"reply": True}),
        ("<tool_call>{not json}</tool_call>", None),
        ('<tool_call>{"arguments": {}}</tool_call>', None),
        ("Ok.", None),
        ("", None),
    ],
)
def test_what_a_response_does(response, action):
    assert response_action(response) == action


def test_tool_action_grades_against_the_accepted_actions():
    accepted = json.dumps([{"tool": "lookup_order", "arguments": {"order_id": "A1001"}}])
    assert grade("tool_action", LOOKUP, accepted) == 1.0
    assert grade("tool_action", LOOKUP.replace("A1001", "A1002"), accepted) == 0.0
    assert grade("tool_action", REFUND, accepted) == 0.0
    assert grade("tool_action", "Let me check that order for you.", accepted) == 0.0
    assert grade("tool_action", "Sorry, that order cannot be refunded.", json.dumps([{"reply": True}])) == 1.0
    assert grade("tool_action", LOOKUP, "not json") == 0.0


def _context(desk, task_id, *turns):
    """The messages an episode produced after the scripted turns."""
    it = iter([*turns, Completion({"content": "Done, thank you."}, 3)])
    return episode_run(desk, desk.task(task_id), lambda m, t, n: next(it)).messages


def _call(name, order_id):
    arguments = json.dumps({"order_id": order_id})
    return Completion(
        {
            "content": "",
            "tool_calls": [{"id": f"c{name}", "type": "function", "function": {"name": name, "arguments": arguments}}],
        },
        9,
    )


def accepted(task_id, messages):
    desk = SupportDesk()
    return json.loads(turn_reference(task=desk.task(task_id), messages=messages))


def test_the_accepted_next_action_follows_the_hidden_policy():
    desk = SupportDesk()
    a, f = ALLOWED.hidden["order_id"], LATE.hidden["order_id"]
    lookup = {"tool": "lookup_order", "arguments": {"order_id": a}}
    refund = {"tool": "issue_refund", "arguments": {"order_id": a}}
    start = ALLOWED.first_messages()
    assert accepted(ALLOWED.id, start) == [lookup, refund]  # refundable: look it up, or refund at once
    looked = _context(desk, ALLOWED.id, _call("lookup_order", a))[:-1]
    assert accepted(ALLOWED.id, looked) == [refund]
    refunded = _context(desk, ALLOWED.id, _call("issue_refund", a))[:-1]
    assert accepted(ALLOWED.id, refunded) == [{"reply": True}]

    not_allowed = LATE.first_messages()
    assert accepted(LATE.id, not_allowed) == [{"tool": "lookup_order", "arguments": {"order_id": f}}]
    looked = _context(desk, LATE.id, _call("lookup_order", f))[:-1]
    assert accepted(LATE.id, looked) == [{"reply": True}]
    # A failed lookup (wrong id) does not count as having looked the order up.
    missed = _context(desk, LATE.id, _call("lookup_order", "A9999"))[:-1]
    assert accepted(LATE.id, missed) == [{"tool": "lookup_order", "arguments": {"order_id": f}}]
    tracking = next(t for t in desk.tasks() if not t.hidden["graded"])
    assert turn_reference(task=tracking, messages=tracking.first_messages()) is None


def _store(deployment, external_id, task_id, split, messages):
    from feedback.services.ingest import traces_ingest

    result = traces_ingest(
        deployment=deployment,
        items=[
            {
                "external_id": external_id,
                "environment": "support-desk",
                "metadata": {"task_id": task_id, "split": split},
                "tools": SupportDesk().task(task_id).tools,
                "messages": messages,
            }
        ],
        source=TraceSource.INGEST,
    )
    assert result[0].status == "created", result[0]


@pytest.mark.django_db
def test_a_training_set_holds_every_graded_turn_of_the_training_tasks_only():
    from tests.factories import DeploymentFactory

    desk = SupportDesk()
    deployment = DeploymentFactory(name="support-bot")
    train_task = desk.tasks_for(split="train", graded=True)[0]
    heldout_task = desk.tasks_for(split="test", graded=True)[0]
    tracking = desk.tasks_for(split="train", graded=False)[0]
    order = train_task.hidden["order_id"]
    _store(deployment, "ep-1", train_task.id, "train", _context(desk, train_task.id, _call("lookup_order", order)))
    _store(
        deployment,
        "ep-2",
        heldout_task.id,
        "test",
        _context(desk, heldout_task.id, _call("lookup_order", heldout_task.hidden["order_id"])),
    )
    _store(
        deployment,
        "ep-3",
        tracking.id,
        "train",
        [*tracking.first_messages(), {"role": "assistant", "content": "It ships soon."}],
    )

    items = episode_turn_items(deployment=deployment, environment="support-desk")
    assert [it["key"].rsplit(":", 2)[1:] for it in items] == [["ep-1", "2"], ["ep-1", "4"]]
    first, second = items
    assert first["messages"] == [
        {"role": "system", "content": train_task.system},
        {"role": "user", "content": train_task.prompt},
    ]
    assert first["grader"] == "tool_action" and first["tools"] == train_task.tools
    assert json.loads(first["reference"])[0] == {"tool": "lookup_order", "arguments": {"order_id": order}}
    assert second["messages"][-1]["role"] == "tool"
    assert json.loads(second["reference"]) == json.loads(turn_reference(task=train_task, messages=second["messages"]))

    later = episode_turn_items(deployment=deployment, environment="support-desk", first_turns=False)
    assert [it["key"] for it in later] == [second["key"]]

    training_set = training_set_from_episodes(
        deployment=deployment, environment="support-desk", name="desk", heldout_fraction=0
    )
    assert (
        training_set.item_count == 2
        and TrainingItem.objects.filter(training_set=training_set, grader="tool_action").count() == 2
    )
    assert Trace.objects.count() == 3


def test_a_lookup_that_found_the_order_in_another_case_counts_and_one_that_errored_does_not():
    """The tools read an id in any case: after a lower-case lookup that returned the order,
    the policy's next turn is the decision, not another lookup; after an error it is still
    the lookup."""
    desk = SupportDesk()
    task = next(t for t in (ALLOWED, *_tasks(allowed=True)) if not t.hidden["order_id"].isdigit())
    order = task.hidden["order_id"]
    looked = _context(desk, task.id, _call("lookup_order", order.lower()))[:-1]
    assert json.loads(looked[-1]["content"])["order_id"] == order, "the tool found it"
    assert accepted(task.id, looked) == [{"tool": "issue_refund", "arguments": {"order_id": order}}]
    assert "lookup_order" not in turn_target(task=task, messages=looked)

    failed = _context(desk, task.id, _call("lookup_order", order + "X"))[:-1]
    assert failed[-1]["content"].startswith("error")
    assert {"tool": "lookup_order", "arguments": {"order_id": order}} in accepted(task.id, failed)


def test_a_refund_that_errored_under_a_call_id_an_earlier_lookup_used_is_not_done():
    """Served turns name their first call `call_0` every time: a result answers the calls of
    the turn just before it, so the lookup's success does not make the failed refund done."""
    desk = SupportDesk()
    order = ALLOWED.hidden["order_id"]

    def call(name, arguments):
        return Completion(
            {
                "content": "",
                "tool_calls": [
                    {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
                ],
            },
            9,
        )

    messages = _context(
        desk,
        ALLOWED.id,
        call("lookup_order", {"order_id": order}),
        call("issue_refund", {"order_id": order, "amount": 10**6}),
    )[:-1]
    assert messages[-1]["content"].startswith("error"), "the refund over the price failed"
    assert accepted(ALLOWED.id, messages) == [{"tool": "issue_refund", "arguments": {"order_id": order}}]
    assert "issued" not in turn_target(task=ALLOWED, messages=messages)


def test_results_answer_calls_in_order_when_one_turn_repeats_an_id_and_text_parts_are_read():
    from training.environments.support_desk.transcripts import done_actions

    order = ALLOWED.hidden["order_id"]

    def call(name):
        return {
            "id": "call_0",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps({"order_id": order})},
        }

    turn = {"role": "assistant", "content": "", "tool_calls": [call("lookup_order"), call("issue_refund")]}
    ok = {"role": "tool", "tool_call_id": "call_0", "content": json.dumps({"order_id": order})}
    failed = {"role": "tool", "tool_call_id": "call_0", "content": [{"type": "text", "text": "error: refused"}]}
    assert done_actions([turn, ok, failed], order) == {"lookup_order"}
    assert done_actions([turn, {**ok, "content": None}], order) == set(), "no text is no result"


def test_a_corrected_turn_is_the_accepted_action_in_the_harness_format():
    """The SFT targets: refund where the policy allows, answer in words where it does not,
    each one what the grader accepts and what the harness's regex lets the agent write."""
    desk = SupportDesk()
    targets = {}
    for key, task in (("allowed", ALLOWED), ("late", LATE)):
        order = task.hidden["order_id"]
        for name, context in (
            ("start", task.first_messages()),
            ("looked", _context(desk, task.id, _call("lookup_order", order))[:-1]),
            ("refunded", _context(desk, task.id, _call("issue_refund", order))[:-1]),
        ):
            target = turn_target(task=task, messages=context)
            assert re.fullmatch(ACT_OR_REPLY_REGEX, target), target
            assert grade("tool_action", target, turn_reference(task=task, messages=context)) == 1.0
            targets[key, name] = target
    a = ALLOWED.hidden["order_id"]
    assert targets["allowed", "looked"] == REFUND.replace("A1001", a)
    assert targets["allowed", "start"] == LOOKUP.replace("A1001", a)
    assert response_action(targets["late", "looked"]) == {"reply": True}
    assert "issued" in targets["allowed", "refunded"]
    tracking = next(t for t in desk.tasks() if not t.hidden["graded"])
    assert turn_target(task=tracking, messages=tracking.first_messages()) is None


def test_a_corrected_turn_is_rendered_over_the_order_the_customer_named_and_its_lookup():
    """Every target names the order of its own conversation (whatever the id's format) and a
    refusal says what the lookup showed: a model trained on them is taught to copy the id it
    was given and to read the order, not one training order's words."""
    desk = SupportDesk()
    late_days = desk.table.row(LATE.hidden["order_id"])["delivered_days_ago"]
    looked = _context(desk, LATE.id, _call("lookup_order", LATE.hidden["order_id"]))[:-1]
    assert f"delivered {late_days} days ago" in turn_target(task=LATE, messages=looked)
    shapes = set()
    every_id = {t.hidden["order_id"] for t in desk.tasks()}
    for task in desk.tasks_for(split="test", graded=True):
        order = task.hidden["order_id"]
        shapes.add(re.sub(r"[A-Z]", "A", re.sub(r"[0-9]", "9", order)))
        for context in (task.first_messages(), _context(desk, task.id, _call("lookup_order", order))[:-1]):
            target = turn_target(task=task, messages=context)
            assert re.fullmatch(ACT_OR_REPLY_REGEX, target), target
            assert order in target
            assert not (every_id - {order}) & set(re.findall(r"[A-Z0-9][A-Z0-9-]{2,14}", target)), target
            row = desk.table.row(order)
            if not task.hidden["refund"] and len(context) > 2:
                if row["status"] == "refunded":
                    assert "already been refunded" in target
                elif row["status"] == "delivered":
                    assert f"{row['delivered_days_ago']} days ago" in target
                else:
                    assert row["status"] in target
    assert len(shapes) == 5


@pytest.mark.django_db
def test_a_training_set_with_targets_holds_the_corrected_turns_for_sft():
    from tests.factories import DeploymentFactory

    desk = SupportDesk()
    deployment = DeploymentFactory(name="support-bot")
    refundable = _tasks(allowed=True)[1]
    refused = LATE
    for external_id, task in (("ep-1", refundable), ("ep-2", refused)):
        order = task.hidden["order_id"]
        _store(deployment, external_id, task.id, task.split, _context(desk, task.id, _call("lookup_order", order)))

    without = episode_turn_items(deployment=deployment, environment="support-desk", split="train", first_turns=False)
    assert all(it.get("corrected_response") is None for it in without)

    training_set = training_set_from_episodes(
        deployment=deployment,
        environment="support-desk",
        name="desk",
        split="train",
        heldout_fraction=0,
        first_turns=False,
        targets=True,
    )
    rows = {
        row.trace.external_id: row.corrected_response
        for row in TrainingItem.objects.filter(training_set=training_set).select_related("trace")
    }
    assert rows["ep-1"] == REFUND.replace("A1001", refundable.hidden["order_id"])
    assert response_action(rows["ep-2"]) == {"reply": True}
    assert training_set.selection["targets"] is True


@pytest.mark.django_db
def test_counterfactual_copies_of_a_decision_stay_with_it_across_the_heldout_split_and_say_they_are_oracle():
    from tests.factories import DeploymentFactory
    from training.services.training_sets import TrainingSetError

    desk = SupportDesk()
    deployment = DeploymentFactory(name="support-bot")
    tasks = _tasks(allowed=True)[:6] + _tasks(allowed=False)[:6]
    for i, task in enumerate(tasks):
        order = task.hidden["order_id"]
        _store(deployment, f"ep-{i}", task.id, task.split, _context(desk, task.id, _call("lookup_order", order)))
    # A test task whose trace claims to be training traffic stays out.
    test_task = next(t for t in desk.tasks_for(split="test", graded=True))
    looked = _context(desk, test_task.id, _call("lookup_order", test_task.hidden["order_id"]))
    _store(deployment, "ep-test", test_task.id, "train", looked)

    def build():
        return training_set_from_episodes(
            deployment=deployment,
            environment="support-desk",
            name="desk",
            heldout_fraction=0.5,
            first_turns=False,
            targets=True,
            variants=4,
        )

    training_set = build()
    rows = list(TrainingItem.objects.filter(training_set=training_set))
    assert training_set.item_count == len(tasks) * 5 and training_set.selection["variants"] == 4
    by_turn: dict[str, list] = {}
    for row in rows:
        by_turn.setdefault(row.key.split(":counterfactual-")[0], []).append(row)
        assert row.provenance["labels"] == "oracle"
    assert len(by_turn) == len(tasks) and not any("ep-test" in key for key in by_turn)
    assert {row.split for row in rows} == {"train", "heldout"}  # both sides used, each turn on one
    for copies in by_turn.values():
        assert len({row.split for row in copies}) == 1
        assert sorted(row.provenance.get("counterfactual", 0) for row in copies) == [0, 1, 2, 3, 4]
    # Copies of a refusal include refunds and copies of a refund include refusals.
    flipped = {
        original.corrected_response.startswith("<tool_call>")
        for copies in by_turn.values()
        for original in copies
        if "counterfactual" not in original.provenance
        for copy in copies
        if copy.provenance.get("counterfactual")
        and copy.corrected_response.startswith("<tool_call>") != original.corrected_response.startswith("<tool_call>")
    }
    assert flipped == {True, False}
    # The same copies on a rebuild.
    again = build()
    assert sorted(
        (r.key, r.corrected_response, json.dumps(r.messages)) for r in TrainingItem.objects.filter(training_set=again)
    ) == sorted((r.key, r.corrected_response, json.dumps(r.messages)) for r in rows)
    for bad, targets in ((4, False), (99, True), (-1, True)):
        with pytest.raises(TrainingSetError) as caught:
            episode_turn_items(deployment=deployment, environment="support-desk", targets=targets, variants=bad)
        assert caught.value.errors[0][0] == "variants"


def test_the_oracle_turns_play_each_task_to_success_over_its_own_order():
    """`oracle_turns` (oracle labels: the hidden policy's own moves) are contexts an SFT set
    can use without logged traffic: played back as a model's turns they succeed, touch no
    other order and name no id the customer did not give."""
    desk = SupportDesk()
    fresh = [t for t in desk.tasks_fresh(seed=3) if t.hidden["graded"]]
    tasks = desk.tasks_for(split="train", graded=True)[:24] + fresh[:12]
    for task in tasks:
        turns = oracle_turns(task=task, env=desk)
        assert turns and turns[0]["messages"] == task.first_messages()
        targets = iter(t["target"] for t in turns)

        def complete(messages, tools, max_tokens, targets=targets):
            content, calls = tool_calls_parse(next(targets))
            return Completion({"content": content, **({"tool_calls": calls} if calls else {})}, 5)

        episode = episode_run(desk, task, complete)
        assert episode.reward == 1.0, (task.id, episode.grade.reason)
        assert episode.audit.collateral_changes == () and episode.audit.unknown_ids == ()
        for turn in turns:
            assert turn["target"] == turn_target(task=task, messages=turn["messages"])
            assert grade("tool_action", turn["target"], turn["reference"]) == 1.0
    tracking = desk.tasks_for(split="train", graded=False)[0]
    assert oracle_turns(task=tracking, env=desk) == []
