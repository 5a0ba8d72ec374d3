"""A policy note's structured rule, and what it asks for at a decision point.

A rule is a conjunction of conditions on a decision context's fields, the action it asks
for when they all hold, and optionally the action when one does not:

    {"conditions": [{"field": "status", "op": "=", "value": "delivered"},
                    {"field": "days_since_delivery", "op": "<=", "value": 30}],
     "action": "refund", "otherwise": "answer"}

reads `status = delivered and days_since_delivery ≤ 30 → refund; otherwise → answer`.
A rule says nothing (None) where it cannot tell whether its conditions hold (a field it
reads is missing or cannot be compared, and no other condition fails): it never guesses. Django-free, so the judge, the pages and the trainer share it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPS = ("=", "!=", "<", "<=", ">", ">=")
_SHOWN_OPS = {"<=": "≤", ">=": "≥", "!=": "≠"}
MAX_CONDITIONS = 6
NAME_MAX = 60
VALUE_MAX = 200

_VALUE_SCHEMA = {"anyOf": [{"type": "string", "maxLength": VALUE_MAX}, {"type": "number"}, {"type": "boolean"}]}
RULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "conditions": {
            "type": "array",
            "minItems": 1,
            "maxItems": MAX_CONDITIONS,
            "items": {
                "type": "object",
                "properties": {
                    "field": {"type": "string", "minLength": 1, "maxLength": NAME_MAX},
                    "op": {"type": "string", "enum": list(OPS)},
                    "value": _VALUE_SCHEMA,
                },
                "required": ["field", "op", "value"],
                "additionalProperties": False,
            },
        },
        "action": {"type": "string", "minLength": 1, "maxLength": NAME_MAX},
        "otherwise": {"anyOf": [{"type": "string", "minLength": 1, "maxLength": NAME_MAX}, {"type": "null"}]},
    },
    "required": ["conditions", "action", "otherwise"],
    "additionalProperties": False,
}


class RuleError(ValueError):
    """A rule that does not fit the format; the message names the part (`conditions[1].op`)."""


@dataclass(frozen=True, slots=True)
class Condition:
    field: str
    op: str
    value: str | int | float | bool


@dataclass(frozen=True, slots=True)
class Rule:
    conditions: tuple[Condition, ...]
    action: str
    otherwise: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "conditions": [{"field": c.field, "op": c.op, "value": c.value} for c in self.conditions],
            "action": self.action,
            "otherwise": self.otherwise,
        }

    def text(self) -> str:
        """The rule in one line, as people write it."""
        parts = [f"{c.field} {_SHOWN_OPS.get(c.op, c.op)} {_value_text(c.value)}" for c in self.conditions]
        line = f"{' and '.join(parts)} → {self.action}"
        return f"{line}; otherwise → {self.otherwise}" if self.otherwise else line


def _value_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _name(data: Mapping[str, Any], key: str, where: str, *, optional: bool = False) -> str | None:
    value = data.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value.strip():
        raise RuleError(f"{where}{key}: a non-empty string is needed")
    if len(value) > NAME_MAX:
        raise RuleError(f"{where}{key}: at most {NAME_MAX} characters")
    return value.strip()


def rule_parse(data: Any) -> Rule:
    """`data` (a rule as JSON) as a `Rule`, or `RuleError` naming what does not fit."""
    if not isinstance(data, Mapping):
        raise RuleError("a rule is an object with conditions, action and otherwise")
    extra = set(data) - {"conditions", "action", "otherwise"}
    if extra:
        raise RuleError(f"{sorted(extra)[0]}: not a part of a rule (conditions, action, otherwise)")
    raw = data.get("conditions")
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_CONDITIONS:
        raise RuleError(f"conditions: a list of 1 to {MAX_CONDITIONS} conditions is needed")
    conditions = []
    for i, c in enumerate(raw):
        where = f"conditions[{i}]."
        if not isinstance(c, Mapping):
            raise RuleError(f"conditions[{i}]: an object with field, op and value is needed")
        op = c.get("op")
        if op not in OPS:
            raise RuleError(f"{where}op: one of {', '.join(OPS)}")
        value = c.get("value")
        if not isinstance(value, str | int | float | bool) or (isinstance(value, str) and len(value) > VALUE_MAX):
            raise RuleError(f"{where}value: a string (at most {VALUE_MAX} characters), a number or true/false")
        if op not in ("=", "!=") and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise RuleError(f"{where}value: {op} compares numbers, so the value must be a number")
        conditions.append(Condition(field=_name(c, "field", where) or "", op=op, value=value))
    return Rule(
        conditions=tuple(conditions),
        action=_name(data, "action", "") or "",
        otherwise=_name(data, "otherwise", "", optional=True),
    )


_UNDECIDED = object()


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    return None


def _holds(condition: Condition, value: Any) -> Any:
    """True or False, or `_UNDECIDED` when the value cannot be compared as the rule asks."""
    if value is None:
        return _UNDECIDED
    if condition.op in ("=", "!="):
        want = condition.value
        if isinstance(want, bool) or isinstance(value, bool):
            same = isinstance(want, bool) and isinstance(value, bool) and want == value
        elif _number(want) is not None or _number(value) is not None:
            same = _number(want) is not None and _number(value) is not None and _number(want) == _number(value)
        else:
            same = str(value).strip().casefold() == str(want).strip().casefold()
        return same if condition.op == "=" else not same
    left, right = _number(value), _number(condition.value)
    if left is None or right is None:
        return _UNDECIDED
    return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[condition.op]


def rule_action(rule: Rule, fields: Mapping[str, Any]) -> str | None:
    """The action `rule` asks for where the decision context shows `fields`: `action` when
    every condition holds, `otherwise` when one does not (even if another cannot be told:
    a shipped order has no delivery age, and `status = delivered` already fails), None when
    no condition fails but one reads a missing or incomparable field."""
    outcomes = [_holds(c, fields.get(c.field)) for c in rule.conditions]
    if any(o is False for o in outcomes):
        return rule.otherwise
    if any(o is _UNDECIDED for o in outcomes):
        return None
    return rule.action


_CONDITION = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|!=|≤|≥|≠|=|<|>)\s*(.+?)\s*$")
_FROM_SHOWN = {"≤": "<=", "≥": ">=", "≠": "!="}
_ARROW = re.compile(r"\s*(?:→|->)\s*")


def _value_from_text(raw: str) -> str | int | float | bool:
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "\"'":
        return raw[1:-1]
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw


def rule_from_text(line: str) -> Rule:
    """A rule written as `Rule.text()` writes it (`->` for →, `<=` for ≤ also read):
    `status = delivered and days_since_delivery <= 30 -> refund; otherwise -> answer`.
    `RuleError` says what does not read."""
    head, _, otherwise_part = line.partition(";")
    parts = _ARROW.split(head.strip())
    if len(parts) != 2 or not parts[1].strip():
        raise RuleError("action: write the conditions, then → (or ->) and the action")
    conditions = []
    for i, text in enumerate(re.split(r"\s+and\s+", parts[0].strip())):
        match = _CONDITION.match(text)
        if match is None:
            raise RuleError(f"conditions[{i}]: {text[:80]!r} is not `field op value` (op: = != < <= > >=)")
        field, op, raw = match.groups()
        conditions.append({"field": field, "op": _FROM_SHOWN.get(op, op), "value": _value_from_text(raw)})
    otherwise = None
    if otherwise_part.strip():
        other = _ARROW.split(otherwise_part.strip())
        if len(other) != 2 or other[0].strip().lower() != "otherwise" or not other[1].strip():
            raise RuleError("otherwise: write `; otherwise → action` after the rule")
        otherwise = other[1].strip()
    return rule_parse({"conditions": conditions, "action": parts[1].strip(), "otherwise": otherwise})
