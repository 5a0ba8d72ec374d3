"""Judgements constrained to the agent's actions: the judge does not write the corrected
turn, it chooses it within the agent's own action space, and the product renders it.

The action space is read off the judged conversation: each tool the agent was offered, with
its own parameters schema, except that an id argument (a string property named `id` or
ending in `_id`, at any depth of the arguments) must be one of the ids the conversation
shows (copied from the customer's messages and the tools' results, never made up), plus
`reply` with words to the user. A conversation that shows no id offers no tool that needs
one (an optional id argument is left out), so the schema and the check agree: no id. The
schema is sent as structured output, so a grammar backend (vLLM) cannot write anything else,
and checked here again for endpoints that enforce less. Choosing is classification, far
easier for a small judge than writing a call in free text.

Django-free, like the rest of `feedback.judge`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from feedback.judge.schemas import (
    OutputLimits,
    Rubric,
    SchemaViolation,
    TurnJudgement,
    validate,
)
from feedback.schema_validation import tool_parameter_schemas
from training.inference.codec import tool_calls_parse

# The most recent ids are kept past this many: the judged turn answers the end.
MAX_IDS = 256
ID_MAX_CHARS = 40
# A token with a digit in it: "A1", "ORD-43443", "LF642079", "7043918"; a bare number only
# from four digits (not a day count such as "12"); a price ("16.8") splits at the dot.
_ID = re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9][A-Za-z0-9_-]*[0-9][A-Za-z0-9_-]*")
_ID_PARAM = re.compile(r"(^|_)id$", re.IGNORECASE)


def _texts(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if isinstance(content, list):
        return [p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return [content] if isinstance(content, str) else []


def conversation_ids(context: Sequence[dict[str, Any]]) -> list[str]:
    """The ids the conversation shows, in the order they first appear: tokens with a digit
    in the user's messages and in the tools' results (what the agent read, not what it wrote);
    past `MAX_IDS`, the latest to appear."""
    out: list[str] = []
    for message in context:
        if message.get("role") not in ("user", "tool"):
            continue
        for text in _texts(message):
            for match in _ID.finditer(text):
                token = match.group(0).strip("-_")
                # A bare number is an id only when it is long enough not to be a count.
                shortest = 4 if token.isdigit() else 2
                if shortest <= len(token) <= ID_MAX_CHARS:
                    if token in out:
                        out.remove(token)
                    out.append(token)
    if len(out) <= MAX_IDS:
        return out
    latest = set(out[-MAX_IDS:])
    return [token for token in out if token in latest]


def id_params(parameters: dict[str, Any]) -> list[str]:
    """The string parameters of a tool's schema that hold an id (`id`, `..._id`)."""
    props = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(props, dict):
        return []
    return [
        name
        for name, spec in props.items()
        if _ID_PARAM.search(name) and isinstance(spec, dict) and spec.get("type") == "string"
    ]


def _ids_restrict(schema: dict[str, Any], ids: Sequence[str]) -> bool:
    """Limit every id property of `schema` (nested objects and arrays' items included) to
    `ids`; with none, leave optional ones out. False when a required one cannot be given."""
    props = schema.get("properties")
    if not isinstance(props, dict):
        return True
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    for name, spec in list(props.items()):
        if not isinstance(spec, dict):
            continue
        if _ID_PARAM.search(name) and spec.get("type") == "string":
            if ids:
                spec["enum"] = list(ids)
                spec.pop("pattern", None)
                continue
            ok = False
        else:
            ok = _ids_restrict(spec, ids)
            if ok and isinstance(spec.get("items"), dict):
                ok = _ids_restrict(spec["items"], ids)
        if not ok:
            if name in required:
                return False
            del props[name]
    return True


def _arguments_schema(parameters: dict[str, Any] | None, ids: Sequence[str]) -> dict[str, Any] | None:
    """The tool's arguments with ids among `ids`, or None when the tool cannot be called
    without an id and the conversation shows none."""
    if not isinstance(parameters, dict):
        return {"type": "object"}
    schema = json.loads(json.dumps(parameters))  # a copy that is plain JSON
    schema.setdefault("type", "object")
    return schema if _ids_restrict(schema, ids) else None


def action_space_schema(
    *, tools: Sequence[dict[str, Any]], ids: Sequence[str], limits: OutputLimits | None = None
) -> dict[str, Any]:
    """The structured output of an action judgement: a rationale, the action the feedback
    asks for (one of `tools` with its arguments, ids among `ids`, or a reply), and the reward
    of the logged turn."""
    limits = limits or OutputLimits()
    choices: list[dict[str, Any]] = [
        {
            "type": "object",
            "additionalProperties": False,
            "required": ["kind", "text"],
            "properties": {
                "kind": {"type": "string", "enum": ["reply"]},
                "text": {"type": "string", "minLength": 1, "maxLength": limits.correction_max},
            },
        }
    ]
    for name, parameters in tool_parameter_schemas(list(tools)).items():
        arguments = _arguments_schema(parameters, ids)
        if arguments is None:
            continue
        choices.append(
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["kind", "name", "arguments"],
                "properties": {
                    "kind": {"type": "string", "enum": ["tool"]},
                    "name": {"type": "string", "enum": [name]},
                    "arguments": arguments,
                },
            }
        )
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["rationale", "action", "reward"],
        "properties": {
            "rationale": {"type": "string", "minLength": 3, "maxLength": limits.rationale_max},
            "action": {"anyOf": choices},
            "reward": {"type": "number", "minimum": 0, "maximum": 1},
        },
    }


@dataclass(frozen=True, slots=True)
class ChosenAction:
    kind: str  # "tool" or "reply"
    name: str  # the tool's name; "" for a reply
    arguments: dict[str, Any]
    text: str  # a reply's words; "" for a tool call

    @property
    def label(self) -> str:
        """What kind of action it is, as agreement is counted per kind: the tool or `reply`."""
        return self.name if self.kind == "tool" else "reply"

    def rendered(self) -> str:
        """The turn as the agent writes it (a hermes `<tool_call>` block, or the words)."""
        if self.kind == "tool":
            return f"<tool_call>{json.dumps({'name': self.name, 'arguments': self.arguments})}</tool_call>"
        return self.text

    def as_dict(self) -> dict[str, Any]:
        if self.kind == "tool":
            return {"kind": "tool", "name": self.name, "arguments": self.arguments}
        return {"kind": "reply", "text": self.text}


_TAG = re.compile(r"</?tool_call>", re.IGNORECASE)


def _arguments_check(value: Any, path: str, ids: Sequence[str]) -> None:
    """Every id-named key at any depth holds an id the conversation shows, and no string
    holds a `<tool_call>` tag, which would end the rendered call early."""
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}/{key}"
            if _ID_PARAM.search(str(key)) and isinstance(item, str) and item not in ids:
                shown = "the conversation shows no id" if not ids else "it is not an id the conversation shows"
                raise SchemaViolation(f"{where}: {item[:60]!r}: {shown}")
            _arguments_check(item, where, ids)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _arguments_check(item, f"{path}/{i}", ids)
    elif isinstance(value, str) and _TAG.search(value):
        raise SchemaViolation(f"{path}: holds a <tool_call> tag, which the agent's turn cannot carry in an argument")


def _ids_check(data: Any, *, ids: Sequence[str]) -> None:
    """`SchemaViolation` naming the argument when a chosen call's id (at any depth) is not
    one the conversation shows, or an argument or a reply holds a `<tool_call>` tag."""
    raw = data.get("action") if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        return
    if raw.get("kind") == "reply" and isinstance(raw.get("text"), str) and _TAG.search(raw["text"]):
        raise SchemaViolation("action/text: holds a <tool_call> tag; a reply is words to the user")
    if raw.get("kind") == "tool" and isinstance(raw.get("arguments"), dict):
        _arguments_check(raw["arguments"], "action/arguments", ids)


def parse_action_judgement(
    data: Any, *, schema: dict[str, Any], tools: Sequence[dict[str, Any]], ids: Sequence[str]
) -> tuple[TurnJudgement, ChosenAction]:
    """The judgement with the chosen action rendered as its corrected response, or
    `SchemaViolation` (the judge is asked again) naming what is wrong: an id the conversation
    does not show included, whatever the endpoint enforced."""
    _ids_check(data, ids=ids)  # first: the schema's own message would not say which id
    validate(data, schema)
    raw = data["action"]
    rationale = data["rationale"].strip()
    if not rationale:
        raise SchemaViolation("rationale: blank")
    if raw["kind"] == "reply":
        text = raw["text"].strip()
        if not text:
            raise SchemaViolation("action/text: blank")
        action = ChosenAction(kind="reply", name="", arguments={}, text=text)
    else:
        action = ChosenAction(kind="tool", name=raw["name"], arguments=raw["arguments"], text="")
        # What the agent's own parser reads back must be this call, or the correction is not it.
        words, calls = tool_calls_parse(action.rendered())
        if words.strip() or len(calls) != 1 or json.loads(calls[0]["function"]["arguments"]) != action.arguments:
            raise SchemaViolation("action/arguments: the call does not read back as one tool call")
    criterion = f"The turn is this action: {action.rendered()}"[:240]
    judgement = TurnJudgement(
        rubric=Rubric.from_data([{"criterion": criterion, "weight": 3}]),
        rationale=rationale,
        reward=float(data["reward"]),
        corrected_response=action.rendered(),
    )
    return judgement, action
