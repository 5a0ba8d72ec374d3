"""Programmatic graders for replayable tasks: grade(name, response, reference) → [0, 1].

Items store a grader by name, so this is a plain dict of small pure functions."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable

from training.inference.codec import tool_call_blocks
from training.trainer.openai_graders import grade_reference


def _normalise(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).strip().lower()
    text = re.sub(r"[\s]+", " ", text)
    return text.strip(" .!?,;:\"'`")


def exact(response: str, reference: str) -> float:
    """1 when the response is the reference, ignoring case, surrounding space and punctuation."""
    return float(_normalise(response) == _normalise(reference))


def contains(response: str, reference: str) -> float:
    """1 when the reference appears in the response (case-insensitive)."""
    return float(_normalise(reference) in _normalise(response))


def number(response: str, reference: str) -> float:
    """1 when the first number in the response equals the reference number."""
    match = re.search(r"-?\d+(?:\.\d+)?", response.replace(",", ""))
    if not match:
        return 0.0
    try:
        return float(abs(float(match.group()) - float(reference)) < 1e-9)
    except ValueError:
        return 0.0


def last_number(response: str, reference: str) -> float:
    """1 when the last number in the response equals the reference number
    ("4 + 5 = 9" answers 9)."""
    found = re.findall(r"-?\d+(?:\.\d+)?", response.replace(",", ""))
    if not found:
        return 0.0
    try:
        return float(abs(float(found[-1]) - float(reference)) < 1e-9)
    except ValueError:
        return 0.0


def starts_with(response: str, reference: str) -> float:
    """1 when the response starts with the reference (case-insensitive, leading space ignored)."""
    return float(_normalise(response).startswith(_normalise(reference)))


def json_valid(response: str, reference: str) -> float:
    """1 when the response parses as JSON (the reference is unused)."""
    try:
        json.loads(response)
    except (ValueError, RecursionError):  # model output: any depth
        return 0.0
    return 1.0


def response_action(response: str) -> dict | None:
    """What a response does: its first tool call written as
    `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (read by the chat codec, as the
    inference server reads it) → `{"tool": name, "arguments": {…}}`; a reply of at least 10
    characters without a tool call → `{"reply": True}`; anything else (a tool call that does
    not parse, an empty or near-empty answer) → None. A served message is graded through
    `codec.message_served_text`, so its `tool_calls` count here as the blocks they were."""
    blocks = tool_call_blocks(response)
    if blocks:
        first = blocks[0]
        arguments = first.arguments_object if first.parsed else None
        if arguments is None:
            return None
        return {"tool": first.name, "arguments": arguments}
    if "<tool_call" in response or len(response.strip()) < 10:
        return None
    return {"reply": True}


def tool_action(response: str, reference: str) -> float:
    """1 when the response's action (see `response_action`) is one of those the reference
    accepts: a JSON list of `{"tool": name, "arguments": {…}}` (the arguments must be
    exactly these) or `{"reply": true}` (answer in words, no tool call)."""
    try:
        accepted = json.loads(reference)
    except ValueError:
        return 0.0
    action = response_action(response)
    return float(action is not None and isinstance(accepted, list) and action in accepted)


GRADERS: dict[str, Callable[[str, str], float]] = {
    "exact": exact,
    "contains": contains,
    "number": number,
    "last_number": last_number,
    "starts_with": starts_with,
    "json_valid": json_valid,
    "tool_action": tool_action,
    # A fine-tuning request's grader, stored with the line it reads (training.finetuning).
    "openai": grade_reference,
}


def grade(name: str, response: str, reference: str) -> float:
    try:
        grader = GRADERS[name]
    except KeyError:
        raise ValueError(f"unknown grader {name!r}; known: {', '.join(GRADERS)}") from None
    return float(grader(response, reference))
