"""A policy note's rule: what it asks for at a decision point, against a hand computation,
and the support desk's decision contexts labelled by it."""

from __future__ import annotations

import pytest

from training.environments.policy_rules import RuleError, rule_action, rule_from_text, rule_parse
from training.environments.support_desk import SupportDesk, decision_fields, policy_note_label

WINDOW = rule_from_text("status = delivered and days_since_delivery <= 30 -> refund; otherwise -> answer")


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"status": "delivered", "days_since_delivery": 12}, "refund"),
        ({"status": "delivered", "days_since_delivery": 30}, "refund"),  # ≤ includes the edge
        ({"status": "delivered", "days_since_delivery": 31}, "answer"),
        ({"status": "Delivered", "days_since_delivery": 0}, "refund"),  # words compare without case
        ({"status": "shipped", "days_since_delivery": None}, "answer"),  # one condition fails: enough
        ({"status": "delivered", "days_since_delivery": None}, None),  # no age: the rule cannot tell
        ({"status": "delivered"}, None),
        ({"status": "delivered", "days_since_delivery": "12"}, None),  # not a number: not compared
        ({"status": "delivered", "days_since_delivery": True}, None),
    ],
)
def test_the_rule_asks_for_what_a_hand_computation_gives(fields, expected):
    assert rule_action(WINDOW, fields) == expected


def test_a_rule_without_otherwise_says_nothing_where_it_does_not_hold():
    rule = rule_parse({"conditions": [{"field": "vip", "op": "=", "value": True}], "action": "escalate"})
    assert rule_action(rule, {"vip": True}) == "escalate"
    assert rule_action(rule, {"vip": False}) is None
    assert rule_action(rule, {"vip": 1}) is None  # 1 is not true


def test_the_rule_reads_back_as_it_is_written():
    assert WINDOW.text() == "status = delivered and days_since_delivery ≤ 30 → refund; otherwise → answer"
    assert rule_from_text(WINDOW.text()) == WINDOW
    assert rule_parse(WINDOW.as_dict()) == WINDOW


@pytest.mark.parametrize(
    ("data", "part"),
    [
        ({"conditions": [], "action": "refund"}, "conditions"),
        ({"conditions": [{"field": "days", "op": "~", "value": 3}], "action": "refund"}, "conditions[0].op"),
        ({"conditions": [{"field": "status", "op": "<", "value": "x"}], "action": "refund"}, "conditions[0].value"),
        ({"conditions": [{"field": "days", "op": "<", "value": 3}], "action": ""}, "action"),
        ({"conditions": [{"field": "days", "op": "<", "value": 3}], "action": "a", "then": "b"}, "then"),
    ],
)
def test_a_malformed_rule_is_refused_naming_the_part(data, part):
    with pytest.raises(RuleError) as refused:
        rule_parse(data)
    assert str(refused.value).startswith(f"{part}:")


def test_an_approved_note_labels_the_support_desks_decision_points_as_its_policy_does():
    env = SupportDesk()
    contexts = env.decision_contexts(tasks=env.tasks_for(split="train"), per_point=1, every=5)
    labels = [policy_note_label(WINDOW, c) for c in contexts]
    assert len(contexts) > 10
    assert labels == [c.acts for c in contexts]
    assert {True, False} <= set(labels)
    # A delivered order 10 days ago, by hand: the lookup's row, read under the note's names.
    ten = next(c for c in contexts if c.status == "delivered" and c.x == 10)
    assert decision_fields(ten.messages)["days_since_delivery"] == 10
    assert policy_note_label(WINDOW, ten) is True


def test_a_judge_answer_that_lists_an_item_on_both_sides_keeps_the_rule_and_drops_the_item():
    """A small judge often names one comment as supporting and contradicting: the note is
    kept with that comment in neither list; an item out of range is still refused."""
    from feedback.judge.policy_notes import proposal_parse
    from feedback.judge.schemas import SchemaViolation

    answer = {
        "text": "Refund delivered orders within 30 days.",
        "rule": WINDOW.as_dict(),
        "supporting": [1, 2, 3],
        "contradicting": [3, 4],
    }
    proposal = proposal_parse(answer, 4)
    assert proposal.rule == WINDOW
    assert proposal.supporting == (0, 1) and proposal.contradicting == (3,)
    with pytest.raises(SchemaViolation):
        proposal_parse({**answer, "contradicting": [5]}, 4)
