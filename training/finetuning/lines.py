"""A fine-tuning file's lines: the checks every line passes (read by a worker after the
upload, as OpenAI validates a file), and the training items a job makes of them, within
bounds that keep what one file can cost linear in its size.

A supervised line makes one item per assistant message it trains on, each carrying every
message before it: a line of N such messages makes N items of up to N messages. So a line may
have at most `FINETUNE_MAX_MESSAGES_PER_LINE` messages and `FINETUNE_MAX_TARGETS_PER_LINE`
of them to train on, and the items one job makes may come to at most
`FINETUNE_MAX_ITEM_BYTES`, counted from each message's size before any item is built."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from django.conf import settings

from training.inference.codec import message_served_text
from training.models import TrainingItemKind
from training.trainer import openai_graders
from webapp.kernel.chat_format import MAX_JSON_DEPTH, json_depth
from webapp.kernel.errors import Invalid
from webapp.kernel.nul import strip_nul

MAX_LINE_ERRORS = 5
MAX_LINES = 10_000
MAX_RUBRIC = 16_384
ROLES = ("system", "developer", "user", "assistant", "tool")
# What a stored item holds beside its messages, tools and target: key, kind, split, provenance.
ITEM_OVERHEAD = 256


class FineTuningError(Invalid, ValueError):
    def __init__(self, errors: list[tuple[str, str]]):
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors), errors=errors)


def _size(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def _rows(content: str) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """(line number, the line's object) for each non-blank line, or (number, what is wrong)."""
    # Lines end at "\n" only: JSON strings may hold U+2028, U+2029 or U+0085 raw, which
    # str.splitlines would also break on.
    count = 0
    for number, line in enumerate(content.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        count += 1
        if count > MAX_LINES:
            yield number, f"has more than {MAX_LINES} lines"
            return
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            yield number, f"line {number} is not JSON"
            continue
        if not isinstance(row, dict):
            yield number, f"line {number} must be a JSON object"
        elif json_depth(row) > MAX_JSON_DEPTH:
            yield number, f"line {number} is nested deeper than {MAX_JSON_DEPTH} levels"
        else:
            yield number, strip_nul(row)  # a "\u0000" escape: the store holds no NUL


def _lines(content: str, field: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """The file's line objects; the first bad line (or an empty file) raises, naming `field`."""
    seen = False
    for number, row in _rows(content):
        if isinstance(row, str):
            raise FineTuningError([(field, row)])
        seen = True
        yield number, row
    if not seen:
        raise FineTuningError([(field, "has no lines")])


def _messages(row: dict[str, Any], number: int, field: str) -> list[dict[str, Any]]:
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise FineTuningError([(field, f"line {number}: messages must be a non-empty list")])
    limit = settings.FINETUNE_MAX_MESSAGES_PER_LINE
    if len(messages) > limit:
        raise FineTuningError(
            [
                (
                    field,
                    f"line {number}: {len(messages)} messages; at most {limit} per line "
                    "(PRACTICUM_FINETUNE_MAX_MESSAGES_PER_LINE)",
                )
            ]
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise FineTuningError([(field, f"line {number}: messages[{i}] needs a role of {', '.join(ROLES)}")])
        wrong = _message_shape(message)
        if wrong:
            raise FineTuningError([(field, f"line {number}: messages[{i}].{wrong}")])
    tools = row.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise FineTuningError([(field, f"line {number}: tools must be a list of tool definitions")])
    targets = sum(1 for m in messages if m["role"] == "assistant" and m.get("weight", 1) != 0)
    limit = settings.FINETUNE_MAX_TARGETS_PER_LINE
    if targets > limit:
        raise FineTuningError(
            [
                (
                    field,
                    f"line {number}: {targets} assistant messages to train on; at most {limit} per line "
                    "(PRACTICUM_FINETUNE_MAX_TARGETS_PER_LINE; give the others weight 0, or split the line)",
                )
            ]
        )
    return messages


def _message_shape(message: dict[str, Any]) -> str:
    """What is wrong with a message's content or tool calls ("" when nothing): the chat
    format's shapes, which the SFT target and the exports read."""
    content = message.get("content")
    parts_ok = isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text", ""), str) for p in content
    )
    if content is not None and not isinstance(content, str) and not parts_ok:
        return "content must be text, a list of text parts, or null"
    calls = message.get("tool_calls")
    if calls is None:
        return ""
    if not isinstance(calls, list):
        return "tool_calls must be a list"
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return "tool_calls must each have a function with a name"
        if not isinstance(function.get("arguments", "{}"), str | dict):
            return "tool_calls' arguments must be a JSON string or an object"
    return ""


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _supervised_line(row: dict[str, Any], number: int, field: str) -> tuple[list[dict], list[int], int]:
    """A line's messages (without `weight`), the positions it trains on, and the bytes its
    items come to — from each message's size, before any item exists."""
    messages = [{k: v for k, v in m.items() if k != "weight"} for m in _messages(row, number, field)]
    raw = row["messages"]
    targets = [i for i, m in enumerate(raw) if m["role"] == "assistant" and m.get("weight", 1) != 0]
    if not targets:
        raise FineTuningError([(field, f"line {number}: no assistant message to train on")])
    if targets[0] == 0:
        raise FineTuningError([(field, f"line {number}: messages[0] has no context before it")])
    extra = _size(row.get("tools") or []) + ITEM_OVERHEAD
    before, total, i = 0, 0, 0
    for t in targets:
        while i < t:  # the context of target t: every message before it
            before += _size(messages[i]) + 2
            i += 1
        total += before + _size(messages[t]) + extra
    return messages, targets, total


def _budget_check(used: int, budget: int, field: str, number: int) -> None:
    if used > budget:
        raise FineTuningError(
            [
                (
                    field,
                    f"makes over {budget} bytes of training items by line {number}; at most {budget} per job "
                    "(PRACTICUM_FINETUNE_MAX_ITEM_BYTES)",
                )
            ]
        )


def file_check(content: str) -> tuple[list[str], dict[str, Any]]:
    """Read every line as a worker does after an upload: (what is wrong, at most
    MAX_LINE_ERRORS reasons; what was found). A line that cannot make a supervised item
    (no assistant message, say) may still make a reinforcement one: that is noted in the
    summary (`supervised_problem`), not refused."""
    errors: list[str] = []
    summary: dict[str, Any] = {"lines": 0, "supervised_item_bytes": 0, "line_bytes": 0, "supervised_problem": ""}
    for number, row in _rows(content):
        if isinstance(row, str):
            errors.append(row)
        else:
            try:
                _messages(row, number, "file")
            except FineTuningError as exc:
                errors.extend(reason for _, reason in exc.errors)
            else:
                summary["lines"] += 1
                summary["line_bytes"] += _size(row) + ITEM_OVERHEAD
                try:
                    summary["supervised_item_bytes"] += _supervised_line(row, number, "file")[2]
                except FineTuningError as exc:
                    summary["supervised_problem"] = summary["supervised_problem"] or exc.errors[0][1]
        if len(errors) >= MAX_LINE_ERRORS:
            break
    if not errors and not summary["lines"]:
        errors.append("has no lines")
    return errors, summary


def supervised_items(
    *, content: str, file_id: str, split: str, field: str, budget: int
) -> tuple[list[dict[str, Any]], int]:
    """One SFT item per assistant message of each line (`weight: 0` leaves one out): the
    context before it, and the message, tool calls included, as the target. Returns the items
    and their bytes; a line that would take them past `budget` bytes raises before its items
    are built. Items of a line share its message objects."""
    items, used = [], 0
    for number, row in _lines(content, field):
        messages, targets, size = _supervised_line(row, number, field)
        used += size
        _budget_check(used, budget, field, number)
        for i in targets:
            target = message_served_text(messages[i])
            if not target.strip():
                raise FineTuningError([(field, f"line {number}: messages[{i}] has no content or tool calls")])
            context = messages[:i]
            items.append(
                {
                    "kind": TrainingItemKind.TURN,
                    "key": f"ft:{file_id}:{number}:{i}:{_key(context, target)}",
                    "messages": context,
                    "tools": row.get("tools") or [],
                    "corrected_response": target,
                    "split": split,
                    "provenance": {"source": "fine-tuning file", "file": file_id, "line": number},
                }
            )
    return items, used


def reinforcement_items(
    *, content: str, file_id: str, grader: dict[str, Any], split: str, field: str, budget: int
) -> tuple[list[dict], int]:
    """One task per line: its messages are the prompt, and the rest of the line is what the
    grader's `{{ item.… }}` templates read. A `score_model` grader becomes the judge's rubric.
    Returns the items and their bytes (at most `budget`)."""
    needed = openai_graders.item_fields(grader)
    grader_bytes = _size(grader)
    items, used = [], 0
    for number, row in _lines(content, field):
        messages = _messages(row, number, field)
        if messages[-1]["role"] == "assistant":
            raise FineTuningError([(field, f"line {number}: a reinforcement prompt ends before the answer")])
        item = {k: v for k, v in row.items() if k not in ("messages", "tools")}
        missing = [f for f in needed if openai_graders._lookup(item, f.split(".")) is None]
        if missing:
            raise FineTuningError([(field, f"line {number}: the grader reads item.{missing[0]}, which it lacks")])
        common = {
            "key": f"ft:{file_id}:{number}:{_key(messages, item)}",
            "messages": messages,
            "tools": row.get("tools") or [],
            "split": split,
            "provenance": {"source": "fine-tuning file", "file": file_id, "line": number},
        }
        if grader["type"] == "score_model":
            rubric = _judge_rubric(grader, item, number, field)
            used += _size(row) + len(rubric.encode()) + ITEM_OVERHEAD
            items.append({**common, "kind": TrainingItemKind.TURN, "rubric": rubric})
        else:
            reference = json.dumps({"grader": grader, "item": item}, ensure_ascii=False)
            used += _size(row) + grader_bytes + ITEM_OVERHEAD
            items.append({**common, "kind": TrainingItemKind.TASK, "grader": "openai", "reference": reference})
        _budget_check(used, budget, field, number)
    return items, used


def _judge_rubric(grader: dict[str, Any], item: dict[str, Any], number: int, field: str) -> str:
    """A `score_model` grader's prompt, with the line's fields filled in, as the rubric the
    judge scores each sampled response under."""
    parts = []
    for message in grader.get("input") or []:
        text = openai_graders.render(
            openai_graders._content(message), output_text="(the response being scored)", item=item
        )
        parts.append(f"{message.get('role', 'user')}: {text}")
    low, high = grader.get("range", [0, 1])
    parts.append(f"Score from {low} to {high}.")
    rubric = "\n".join(parts)
    if len(rubric) > MAX_RUBRIC:
        raise FineTuningError([(field, f"line {number}: the grader's prompt fills to over {MAX_RUBRIC} characters")])
    return rubric
