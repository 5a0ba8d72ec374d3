"""Labelling the support desk's decision points by an approved policy note: the fields a
decision point shows (the last lookup's row, also under the names a note may use) and what the
note's rule asks for there."""

from __future__ import annotations

import json
from typing import Any

from training.environments.base import DecisionContext
from training.environments.policy_rules import Rule, rule_action

# The names a policy note may use for the lookup's fields, besides the row's own.
FIELD_ALIASES = {"days_since_delivery": "delivered_days_ago"}
REFUND_ACTIONS = frozenset({"refund", "issue_refund"})


def decision_fields(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields a decision point shows: the row the conversation's last lookup returned
    (`status`, `delivered_days_ago`, `price`, …), also under `FIELD_ALIASES`' names."""
    row: dict[str, Any] = {}
    for m in messages:
        if m.get("role") != "tool":
            continue
        try:
            found = json.loads(str(m.get("content") or ""))
        except ValueError:
            continue
        if isinstance(found, dict):
            row = found
    fields = dict(row)
    for alias, name in FIELD_ALIASES.items():
        if name in row:
            fields.setdefault(alias, row[name])
    return fields


def policy_note_label(rule: Rule, context: DecisionContext) -> bool | None:
    """Whether an approved policy note's `rule` asks for a refund at `context`: True for a
    refund (`refund` or `issue_refund`), False for any other action, None where the rule
    does not cover the case."""
    action = rule_action(rule, decision_fields(context.messages))
    if action is None:
        return None
    return action.strip().casefold() in REFUND_ACTIONS
