"""A records sandbox: each episode gets its own copy of a small table.

An environment built on it declares a table (rows keyed by one field) and which fields a
tool may change, with what values. `reset` copies the rows, so episodes running side by
side never see each other's changes and the source table is never touched. Tools call
`records_lookup` and `records_update`; every refusal (an unknown id or field, a value of
the wrong type or outside its choices, a read-only field, too many calls) is a `ToolError`
the model reads and can recover from. `records_grade` compares the final rows with the
rows a task expects, field by field, and says which differ: the same final rows always
get the same grade.
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from training.environments.base import EpisodeAudit, Grade, Task, ToolError

DEFAULT_MAX_CALLS = 12


@dataclass(frozen=True)
class FieldSpec:
    """What an update may write into a field: its Python type(s), optional allowed
    values, and optional numeric bounds. A field without a spec is read-only."""

    types: tuple[type, ...]
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            # NaN compares false with every bound, so it would pass them all.
            raise ToolError(f"{name} must be a finite number")
        if isinstance(value, bool) and bool not in self.types:
            raise ToolError(f"{name} must be {self._type_names()}, not a boolean")
        if not isinstance(value, self.types):
            raise ToolError(f"{name} must be {self._type_names()}, not {json.dumps(value)[:60]}")
        if self.choices and value not in self.choices:
            allowed = ", ".join(json.dumps(c) for c in self.choices)
            raise ToolError(f"{name} must be one of {allowed}")
        if self.minimum is not None and value < self.minimum:
            raise ToolError(f"{name} must be at least {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:
            raise ToolError(f"{name} must be at most {self.maximum:g}")
        return value

    def _type_names(self) -> str:
        names = {int: "a number", float: "a number", str: "a string", bool: "true or false"}
        return " or ".join(sorted({names.get(t, t.__name__) for t in self.types}))


@dataclass(frozen=True)
class RecordTable:
    """A read-only source table. `rows` are frozen on construction; use `rows_copy()`."""

    name: str  # what the rows are called in messages ("order")
    key: str  # the field that identifies a row ("order_id")
    rows: tuple[Mapping[str, Any], ...]
    writable: Mapping[str, FieldSpec] = field(default_factory=dict)

    def __post_init__(self) -> None:
        frozen = tuple(MappingProxyType(copy.deepcopy(dict(r))) for r in self.rows)
        keys = [r[self.key] for r in frozen]
        if len(set(keys)) != len(keys):
            raise ValueError(f"table {self.name!r} has duplicate {self.key} values")
        object.__setattr__(self, "rows", frozen)
        object.__setattr__(self, "writable", MappingProxyType(dict(self.writable)))

    def rows_copy(self) -> dict[Any, dict[str, Any]]:
        return {r[self.key]: copy.deepcopy(dict(r)) for r in self.rows}

    def row(self, key: Any) -> dict[str, Any]:
        for r in self.rows:
            if r[self.key] == key:
                return copy.deepcopy(dict(r))
        raise KeyError(key)


@dataclass
class RecordsState:
    """One episode's copy of the table, the changes made to it, and the call budget."""

    table: RecordTable
    rows: dict[Any, dict[str, Any]]
    max_calls: int = DEFAULT_MAX_CALLS
    calls: int = 0
    changes: list[dict[str, Any]] = field(default_factory=list)
    task: Task | None = None

    def charge(self) -> None:
        """Count one tool call; refuse once the episode's budget is spent."""
        self.calls += 1
        if self.calls > self.max_calls:
            raise ToolError(f"too many tool calls (at most {self.max_calls} per conversation); answer the customer")


def records_state_new(
    *, table: RecordTable, max_calls: int = DEFAULT_MAX_CALLS, task: Task | None = None
) -> RecordsState:
    return RecordsState(table=table, rows=table.rows_copy(), max_calls=max_calls, task=task)


def _key(state: RecordsState, value: Any) -> Any:
    if not isinstance(value, str | int) or isinstance(value, bool) or value == "":
        raise ToolError(f"{state.table.key} must be a non-empty string")
    for candidate in (value, str(value).strip(), str(value).strip().upper()):
        if candidate in state.rows:
            return candidate
    raise ToolError(f"no {state.table.name} with {state.table.key} {json.dumps(value)[:60]}")


def records_row(*, state: RecordsState, key: Any) -> dict[str, Any]:
    """The episode's current row for `key` (a copy) without counting a tool call: for a
    tool that reads a row before it changes it."""
    return copy.deepcopy(state.rows[_key(state, key)])


def records_lookup(*, state: RecordsState, key: Any) -> dict[str, Any]:
    """The episode's current row for `key` (a copy), or a ToolError naming the unknown id."""
    state.charge()
    return copy.deepcopy(state.rows[_key(state, key)])


def records_update(*, state: RecordsState, key: Any, values: Mapping[str, Any]) -> dict[str, Any]:
    """Write `values` into the row `key` of this episode's copy, all or nothing; returns
    the new row. Unknown or read-only fields and bad values are refused by name."""
    state.charge()
    row_key = _key(state, key)
    if not values:
        raise ToolError("nothing to change")
    row = state.rows[row_key]
    checked: dict[str, Any] = {}
    for name, value in values.items():
        if name not in row:
            known = ", ".join(sorted(row))
            raise ToolError(f"unknown field {name!r}; the fields are: {known}")
        spec = state.table.writable.get(name)
        if spec is None:
            raise ToolError(f"field {name!r} cannot be changed")
        checked[name] = spec.check(name, value)
    before = {name: row[name] for name in checked}
    row.update(checked)
    state.changes.append({"key": row_key, "before": before, "after": dict(checked)})
    return copy.deepcopy(row)


def records_diff(*, state: RecordsState, expected: Mapping[Any, Mapping[str, Any]]) -> list[str]:
    """Where the final rows differ from what is expected: each row named in `expected`
    must hold those values, and every other row must be as in the source table."""
    problems: list[str] = []
    name = state.table.name
    for key in sorted(expected, key=str):
        row = state.rows.get(key)
        if row is None:
            problems.append(f"{name} {key} is missing")
            continue
        for field_name, want in expected[key].items():
            got = row.get(field_name)
            if got != want:
                problems.append(f"{name} {key}: {field_name} is {json.dumps(got)}, expected {json.dumps(want)}")
    for source in state.table.rows:
        key = source[state.table.key]
        if key in expected:
            continue
        if state.rows.get(key) != dict(source):
            problems.append(f"{name} {key} was changed but should not have been")
    return problems


def records_grade(
    *, state: RecordsState, expected: Mapping[Any, Mapping[str, Any]], success: str, extra: Iterable[str] = ()
) -> Grade:
    """1.0 when the final rows are as expected (and no `extra` problem), else 0.0 with the
    first problems as the reason."""
    problems = [*records_diff(state=state, expected=expected), *extra]
    if not problems:
        return Grade(1.0, success)
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    return Grade(0.0, "; ".join(problems[:3]) + more)


def key_normalized(value: Any) -> str:
    """A key as the tools match it: trimmed, any case."""
    return str(value).strip().upper()


def _mentioned(value: str, texts: list[str]) -> bool:
    # A whole token, so that a made-up "A10" is not found inside "A1001".
    pattern = re.compile(rf"(?<![A-Z0-9]){re.escape(value)}(?![A-Z0-9])")
    return any(pattern.search(text) for text in texts)


def call_arguments(call: Any) -> dict[str, Any] | None:
    """The arguments of a logged OpenAI-format tool call as an object, or None. The call is
    the model's output as logged: any shape, arguments a JSON string or an object."""
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except (ValueError, RecursionError):  # the model's text: any length, any depth
            return None
    return arguments if isinstance(arguments, dict) else None


def call_key(call: Any, key: str) -> str | int | None:
    """The `key` argument of a logged tool call (see `call_arguments`) when it is a
    non-empty string or an integer, as a record key is; else None."""
    arguments = call_arguments(call)
    value = arguments.get(key) if arguments is not None else None
    if isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip():
        return value
    return None


def records_violations(*, state: RecordsState) -> list[str]:
    """The episode's writes to the rows its task concerns that the task's expected outcome
    does not contain, in words (see `records_audit`). A row of `hidden["expected"]` breaks it
    when a field the episode wrote ends other than expected (a refund the policy forbids, a
    wrong amount), or when a write came after the field already held its expected value (a
    second refund); a row the task concerns with no expectation, or whose expectation is
    the row as it was, is expected unchanged, so any write to it breaks it."""
    task = state.task
    hidden = task.hidden if task is not None else {}
    expected = {key_normalized(k): dict(v) for k, v in (hidden.get("expected") or {}).items()}
    concerned = set(expected) | {key_normalized(k) for k in (hidden.get("concerns") or ())}
    source = {key_normalized(r[state.table.key]): r for r in state.table.rows}
    name = state.table.name
    found: list[str] = []
    written: dict[Any, list[str]] = {}
    for change in state.changes:
        norm = key_normalized(change["key"])
        if norm not in concerned:
            continue
        want = expected.get(norm)
        before_row = source.get(norm, {})
        unchanged = want is None or all(before_row.get(f) == v for f, v in want.items())
        for field_name, value in change["after"].items():
            if unchanged:
                found.append(
                    f"{name} {change['key']}: {field_name} set to {json.dumps(value)}, "
                    "but the task expects the record unchanged"
                )
            elif field_name in want and change["before"].get(field_name) == want[field_name]:
                found.append(
                    f"{name} {change['key']}: {field_name} written again ({json.dumps(value)}) after it "
                    f"already held the expected {json.dumps(want[field_name])}"
                )
            else:
                fields = written.setdefault(change["key"], [])
                if field_name not in fields:
                    fields.append(field_name)
    for key, fields in written.items():
        want = expected[key_normalized(key)]
        row = state.rows.get(key, {})
        for field_name in fields:
            if field_name in want and row.get(field_name) != want[field_name]:
                found.append(
                    f"{name} {key}: {field_name} is {json.dumps(row.get(field_name))}, "
                    f"the task expects {json.dumps(want[field_name])}"
                )
    return found


def records_audit(*, state: RecordsState, messages: list[dict[str, Any]]) -> EpisodeAudit:
    """The episode's writes outside its task, its writes against the task's own expected
    outcome, and its calls on ids it was never shown.

    A task concerns the rows named in `hidden["expected"]` and in `hidden["concerns"]`; any
    other row written is a collateral change; a write to a concerned row that its expected
    outcome does not contain is a policy violation (`records_violations`). A tool call
    whose key argument (the table's key field) names an id that no earlier system, user or
    successful tool message contains is an unknown id: the model invented it or recalled it
    from training, not from this customer. A lookup's result does not make the id it was asked for known. Ids are compared as the
    tools match them (trimmed, case-insensitive)."""
    task = state.task
    hidden = task.hidden if task is not None else {}
    concerned = {key_normalized(k) for k in (hidden.get("expected") or {})}
    concerned |= {key_normalized(k) for k in (hidden.get("concerns") or ())}
    name = state.table.name
    collateral = []
    for change in state.changes:
        if key_normalized(change["key"]) not in concerned:
            after = ", ".join(f"{k} {json.dumps(v)}" for k, v in change["after"].items())
            collateral.append(f"{name} {change['key']}: {after}")
    seen: list[str] = []
    unknown: list[str] = []
    tainted: set[str] = set()  # calls on unknown ids: their results do not make the id known
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        text = content if isinstance(content, str) else json.dumps(content or "")
        if role in ("system", "user"):
            seen.append(text.upper())
        elif role == "tool":
            if not text.startswith("error") and message.get("tool_call_id", "") not in tainted:
                seen.append(text.upper())
        elif role == "assistant":
            for call in message.get("tool_calls") or []:
                value = call_key(call, state.table.key)
                if value is not None and not _mentioned(key_normalized(value), seen):
                    unknown.append(str(value)[:60])
                    tainted.add(call.get("id", ""))
    return EpisodeAudit(
        collateral_changes=tuple(collateral),
        unknown_ids=tuple(unknown),
        policy_violations=tuple(records_violations(state=state)),
    )
