"""Asking the judge for a policy note: the rule many comments state together, structured
where it can be, with the comments that support it and those that contradict it.

Plain functions over texts (no database): `feedback`'s and `training`'s services give
the comments and store the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from feedback.judge.client import JudgeEndpoint, StructuredResult, call_structured
from feedback.judge.prompts import CURRENT_POLICY_NOTE, Prompt, _clip, defuse
from feedback.judge.schemas import SchemaViolation, validate
from training.environments.policy_rules import RULE_SCHEMA, Rule, RuleError, rule_parse

TEXT_MAX = 600
FACTS_MAX = 600
ITEM_MAX = 800


@dataclass(frozen=True, slots=True)
class CommentItem:
    """One comment as the judge reads it, with what the turn it is on knew and did."""

    facts: str  # the last tool result before the turn ("" when none)
    turn: str  # the turn as the assistant wrote it
    comment: str


@dataclass(frozen=True, slots=True)
class Proposal:
    text: str
    rule: Rule | None
    supporting: tuple[int, ...]  # 0-based indexes into the items shown
    contradicting: tuple[int, ...]


def proposal_schema(n: int) -> dict[str, Any]:
    numbers = {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": n}, "maxItems": n}
    return {
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1, "maxLength": TEXT_MAX},
            "rule": {"anyOf": [RULE_SCHEMA, {"type": "null"}]},
            "supporting": numbers,
            "contradicting": numbers,
        },
        "required": ["text", "rule", "supporting", "contradicting"],
        "additionalProperties": False,
    }


def proposal_parse(data: Any, n: int) -> Proposal:
    """The judge's answer as a `Proposal`; `SchemaViolation` when it does not fit (an item
    number out of range, a malformed rule). An item listed both as supporting and as
    contradicting the rule is in neither list: the judge did not decide it, and the rule and
    the other items stand (a small judge does this often, and asking again costs a whole
    note's answer)."""
    validate(data, proposal_schema(n))
    both = set(data["supporting"]) & set(data["contradicting"])
    supporting = sorted(set(data["supporting"]) - both)
    contradicting = sorted(set(data["contradicting"]) - both)
    try:
        rule = rule_parse(data["rule"]) if data["rule"] is not None else None
    except RuleError as exc:
        raise SchemaViolation(f"rule: {exc}") from None
    return Proposal(
        text=data["text"].strip(),
        rule=rule,
        supporting=tuple(i - 1 for i in supporting),
        contradicting=tuple(i - 1 for i in contradicting),
    )


def render_items(items: Sequence[CommentItem]) -> str:
    blocks = []
    for i, item in enumerate(items, start=1):
        facts = defuse(_clip(item.facts, FACTS_MAX)) if item.facts else "(none)"
        blocks.append(
            f"[{i}] tool result: {facts}\n    turn: {defuse(_clip(item.turn, ITEM_MAX))}\n"
            f"    comment: {defuse(_clip(item.comment, ITEM_MAX))}"
        )
    return "\n".join(blocks)


def propose_note(
    *, items: Sequence[CommentItem], endpoint: JudgeEndpoint, prompt: Prompt = CURRENT_POLICY_NOTE
) -> StructuredResult[Proposal]:
    """One judge call over `items`; raises `JudgeCallFailed` when no attempt gave a fitting answer."""
    n = len(items)
    return call_structured(
        endpoint=endpoint,
        messages=prompt.messages(items=render_items(items)),
        schema_name="policy_note",
        schema=proposal_schema(n),
        parse=lambda data: proposal_parse(data, n),
    )
