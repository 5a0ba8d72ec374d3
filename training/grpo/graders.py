"""Programmatic graders for replayable tasks: grade(name, response, reference) → [0, 1].

Items store a grader by name, so this is a plain dict of small pure functions."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable


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
    except ValueError:
        return 0.0
    return 1.0


GRADERS: dict[str, Callable[[str, str], float]] = {
    "exact": exact,
    "contains": contains,
    "number": number,
    "last_number": last_number,
    "starts_with": starts_with,
    "json_valid": json_valid,
}


def grade(name: str, response: str, reference: str) -> float:
    try:
        grader = GRADERS[name]
    except KeyError:
        raise ValueError(f"unknown grader {name!r}; known: {', '.join(GRADERS)}") from None
    return float(grader(response, reference))
