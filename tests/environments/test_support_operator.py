"""The simulated support lead: words about the first wrong turn, over the order the customer
named, never an action; vague or wrong at the rates it is given."""

from __future__ import annotations

import json
import random

import pytest

from training.environments.records import records_row
from training.environments.support_desk import SupportDesk, oracle_turns
from training.environments.support_operator import operator_comment

ENV = SupportDesk()
SPECIFIC = {"vague_rate": 0.0, "wrong_rate": 0.0}


def _row(task):
    return records_row(state=ENV.reset(task), key=task.hidden["order_id"])


def _task(split: str, predicate):
    return next(t for t in ENV.tasks_for(split=split, graded=True) if predicate(t, _row(t)))


def play(task, actions: list[tuple[str, str]]) -> list[dict]:
    """An episode in the OpenAI format: ("lookup_order" | "issue_refund", order id) runs the
    tool in a fresh copy of the store; ("reply", text) answers the customer."""
    state = ENV.reset(task)
    messages = task.first_messages()
    for n, (name, value) in enumerate(actions):
        if name == "reply":
            messages.append({"role": "assistant", "content": value})
            continue
        call_id = f"call_{n}"
        arguments = json.dumps({"order_id": value})
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}],
            }
        )
        try:
            content = ENV.call(state, name, {"order_id": value})
        except Exception as e:  # a tool error is what the harness shows the model
            content = f"error: {e}"
        messages.append({"role": "tool", "tool_call_id": call_id, "content": content})
    return messages


def test_a_refused_refund_inside_the_window_gets_the_days_and_the_rule_on_the_refusing_turn():
    task = _task("test", lambda t, r: t.hidden["refund"])
    order_id, days = task.hidden["order_id"], _row(task)["delivered_days_ago"]
    messages = play(task, [("lookup_order", order_id), ("reply", "Sorry, we cannot refund this order.")])

    comment = operator_comment(task=task, messages=messages, rng=random.Random(0), **SPECIFIC)

    assert comment is not None and comment.kind == "specific" and comment.mistake == "refused"
    assert comment.message_index == len(messages) - 1
    assert str(days) in comment.body and "30" in comment.body
    assert "refund" in comment.body.lower()


def test_a_refund_past_the_window_is_called_out_without_naming_the_tool():
    task = _task("test", lambda t, r: r["status"] == "delivered" and not t.hidden["refund"])
    order_id = task.hidden["order_id"]
    messages = play(task, [("lookup_order", order_id), ("issue_refund", order_id)])

    comment = operator_comment(task=task, messages=messages, rng=random.Random(1), **SPECIFIC)

    assert comment.mistake == "refunded" and comment.message_index == len(messages) - 2
    assert "30 days" in comment.body or "30-day" in comment.body
    assert "issue_refund" not in comment.body


def test_work_on_another_customers_order_names_both_orders():
    task, other = ENV.tasks_for(split="test", graded=True)[:2]
    messages = play(task, [("lookup_order", other.hidden["order_id"])])

    comment = operator_comment(task=task, messages=messages, rng=random.Random(2), **SPECIFIC)

    assert comment.mistake == "other_order"
    assert task.hidden["order_id"] in comment.body and other.hidden["order_id"] in comment.body


def test_an_episode_the_policy_would_have_played_and_a_tracking_task_get_no_comment():
    task = ENV.tasks_for(split="test", graded=True)[0]
    turns = oracle_turns(task=task, env=ENV)
    played = play(task, [_oracle_action(task, turn["target"]) for turn in turns])
    assert operator_comment(task=task, messages=played, rng=random.Random(3)) is None
    tracking = ENV.tasks_for(split="test", graded=False)[0]
    assert (
        operator_comment(task=tracking, messages=play(tracking, [("reply", "It shipped.")]), rng=random.Random(3))
        is None
    )


def _oracle_action(task, target: str) -> tuple[str, str]:
    if target.startswith("<tool_call>"):
        call = json.loads(target.removeprefix("<tool_call>").removesuffix("</tool_call>"))
        return call["name"], call["arguments"]["order_id"]
    return "reply", target


@pytest.mark.parametrize("split", ["train", "test"])
def test_many_comments_speak_only_words_and_are_vague_or_wrong_at_about_the_given_rates(split):
    rng = random.Random(4)
    comments = []
    for task in ENV.tasks_for(split=split, graded=True):
        order_id = task.hidden["order_id"]
        # The two ways a model goes wrong on this desk: refuse everything, or refund everything.
        wrong_way = "reply" if task.hidden["refund"] else "issue_refund"
        actions = [
            ("lookup_order", order_id),
            (wrong_way, "I am sorry, no refund." if wrong_way == "reply" else order_id),
        ]
        comment = operator_comment(task=task, messages=play(task, actions), rng=rng)
        if comment is not None:
            comments.append(comment)

    assert len(comments) >= 60
    for comment in comments:
        assert not any(
            word in comment.body for word in ("issue_refund", "lookup_order", "<tool_call>", "{", "}", "None")
        )
        assert not comment.body[0].islower() and comment.body.rstrip()[-1] in ".!?"
    share = {kind: sum(c.kind == kind for c in comments) / len(comments) for kind in ("specific", "vague", "wrong")}
    assert 0.03 <= share["wrong"] <= 0.2 and 0.1 <= share["vague"] <= 0.32 and share["specific"] >= 0.55
    assert len({c.body for c in comments if c.kind == "specific"}) >= len(comments) // 3, "phrasings vary"


def test_an_id_in_another_case_or_a_refund_with_its_amount_is_the_right_call_not_another_order():
    task = _task("test", lambda t, r: t.hidden["refund"] and not t.hidden["order_id"].isdigit())
    order_id = task.hidden["order_id"]
    messages = play(task, [("lookup_order", order_id.lower()), ("reply", "Sorry, no refund.")])
    comment = operator_comment(task=task, messages=messages, rng=random.Random(5), **SPECIFIC)
    assert comment.mistake == "refused" and comment.message_index == len(messages) - 1

    refunded = play(task, [("lookup_order", order_id), ("issue_refund", order_id)])
    price = _row(task)["price"]
    refunded[-2]["tool_calls"][0]["function"]["arguments"] = json.dumps({"order_id": order_id, "amount": price})
    assert operator_comment(task=task, messages=refunded[:-1], rng=random.Random(5)) is None


@pytest.mark.parametrize("amount", ["$5", 5, 9.0, "price-0.004", 10**400])
def test_a_refund_of_another_sum_than_the_price_is_called_out_and_the_price_itself_is_not(amount):
    task = _task("test", lambda t, r: t.hidden["refund"] and r["price"] > 10)
    order_id, price = task.hidden["order_id"], _row(task)["price"]
    if amount == "price-0.004":
        amount = f"{price - 0.004:.3f}"  # the tool refunds it; the grade wants the price exactly
    messages = play(task, [("lookup_order", order_id), ("issue_refund", order_id)])
    call = messages[-2]["tool_calls"][0]["function"]

    call["arguments"] = json.dumps({"order_id": order_id, "amount": amount})
    comment = operator_comment(task=task, messages=messages, rng=random.Random(8), **SPECIFIC)
    assert comment.mistake == "amount" and comment.message_index == len(messages) - 2
    assert order_id in comment.body and "full" in comment.body and "amount" not in comment.body

    for full in (price, float(price), f"${price:.2f}"):
        call["arguments"] = json.dumps({"order_id": order_id, "amount": full})
        assert operator_comment(task=task, messages=messages[:-1], rng=random.Random(8), **SPECIFIC) is None, full


@pytest.mark.parametrize("arguments", [{}, {"order_id": None}, {"order_id": ""}, {"amount": 5}])
def test_a_refund_naming_no_order_is_not_called_a_wrong_sum(arguments):
    task = _task("test", lambda t, r: t.hidden["refund"])
    messages = play(task, [("lookup_order", task.hidden["order_id"]), ("issue_refund", task.hidden["order_id"])])
    messages[-2]["tool_calls"][0]["function"]["arguments"] = json.dumps(arguments)
    comment = operator_comment(task=task, messages=messages[:-1], rng=random.Random(11), **SPECIFIC)
    assert comment.mistake != "amount"


def test_a_lookup_with_an_extra_argument_is_still_the_right_lookup():
    task = _task("test", lambda t, r: r["status"] == "delivered" and not t.hidden["refund"])
    order_id = task.hidden["order_id"]
    messages = play(task, [("lookup_order", order_id), ("reply", "Sorry, that order is past our window.")])
    messages[-3]["tool_calls"][0]["function"]["arguments"] = json.dumps({"order_id": order_id, "amount": 5})
    assert operator_comment(task=task, messages=messages, rng=random.Random(12), **SPECIFIC) is None


def test_a_lookup_in_lower_case_then_the_right_refusal_gets_no_comment():
    task = _task(
        "test",
        lambda t, r: r["status"] == "delivered" and not t.hidden["refund"] and not t.hidden["order_id"].isdigit(),
    )
    order_id = task.hidden["order_id"]
    messages = play(task, [("lookup_order", order_id.lower()), ("reply", "Sorry, that order is past our window.")])
    assert operator_comment(task=task, messages=messages, rng=random.Random(9), **SPECIFIC) is None


def test_a_refund_that_errored_is_not_said_to_have_gone_through():
    task = _task("test", lambda t, r: t.hidden["refund"])
    order_id = task.hidden["order_id"]
    messages = play(task, [("lookup_order", order_id), ("issue_refund", order_id), ("reply", "Your refund is done.")])
    messages[-2]["content"] = "error: the payment service did not answer"

    comment = operator_comment(task=task, messages=messages, rng=random.Random(10), **SPECIFIC)

    # The refund call was right; the answer that followed its error is the wrong turn.
    assert comment.message_index == len(messages) - 1
    assert comment.mistake == "refused" and "went through" not in comment.body


@pytest.mark.parametrize(
    "tool_calls",
    [
        [{"id": "c", "type": "function", "function": {"name": "issue_refund", "arguments": {"order_id": "K1"}}}],
        [{"id": ["c"], "function": "issue_refund"}],
        ["<tool_call>"],
        {"not": "a list"},
        [{"function": {"name": "issue_refund", "arguments": "{not json"}}],
    ],
)
def test_logged_tool_calls_of_any_shape_are_read_without_a_crash(tool_calls):
    task = _task("test", lambda t, r: t.hidden["refund"])
    messages = [*task.first_messages(), {"role": "assistant", "content": "", "tool_calls": tool_calls}]
    comment = operator_comment(task=task, messages=messages, rng=random.Random(6), **SPECIFIC)
    assert comment is None or comment.message_index == len(messages) - 1


def test_a_wrong_comment_on_an_order_not_delivered_never_invents_a_delivery_age():
    task = _task("test", lambda t, r: r["status"] != "delivered" and not t.hidden["refund"])
    messages = play(task, [("lookup_order", task.hidden["order_id"]), ("issue_refund", task.hidden["order_id"])])
    comment = operator_comment(task=task, messages=messages, rng=random.Random(7), vague_rate=0, wrong_rate=1)
    assert comment.kind == "wrong" and "None" not in comment.body and "days" not in comment.body
