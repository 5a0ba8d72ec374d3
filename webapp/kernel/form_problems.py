"""A form's errors as its reader sees them: in the words of each field's label, listed in a
summary at the top of the form that links to the fields, and beside each field.

Services name fields as the code does (`heldout_fraction`, `config.group_size`,
`filters.deployment`); a page names them as its labels do. `problems` translates the one into
the other once, so every form says "Held-out fraction: must be a number from 0 to 0.99"
rather than the column's name. `templates/_form_problems.html` draws the summary;
`static/js/forms.js` moves the focus to the first field in error."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Problem:
    field: str  # the form's field name; "" for the form as a whole
    label: str  # the field's label, as the page shows it
    reason: str
    anchor: str  # the id of the field the summary links to ("" when none)

    def __str__(self) -> str:
        return f"{self.label}: {self.reason}" if self.label else self.reason


@dataclass
class FormProblems:
    """The problems of one form, in order; `by_field[name]` is the reason(s) shown beside a field."""

    prefix: str
    items: list[Problem] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __iter__(self) -> Iterator[Problem]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    @property
    def by_field(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for p in self.items:
            if p.field:
                out[p.field] = f"{out[p.field]}; {p.reason}" if p.field in out else p.reason
        return out

    @property
    def id(self) -> str:
        return f"{self.prefix}-errors"

    def text(self) -> str:
        """One line for a flash message."""
        return "; ".join(str(p) for p in self.items)


def field_id(prefix: str, name: str) -> str:
    return f"{prefix}-{name.replace('_', '-')}"


def problems(errors: Iterable[tuple[str, str]], *, labels: dict[str, str], prefix: str) -> FormProblems:
    """(field, reason) pairs as a service names them, in the words of `labels` (a form's
    field names to their labels). A nested name (`config.steps`, `filters.deployment`) is the
    field of its last part when the form has one (`steps`), else of its first (`filters`),
    the rest named in the reason; a name the form has no field for is the form's as a whole."""
    out = FormProblems(prefix=prefix)
    for name, reason in errors:
        head, _, tail = name.partition(".")
        last = name.rsplit(".", 1)[-1]
        if name in labels:
            target, said = name, reason
        elif tail and last in labels:
            target, said = last, reason
        elif tail and head in labels:
            target, said = head, f"{tail}: {reason}"
        else:
            target, said = "", reason
        if target:
            out.items.append(Problem(target, labels[target], said, field_id(prefix, target)))
        else:
            out.items.append(Problem("", "", said, ""))
    # In the order of the page (`labels` lists the fields as the form does); the form's own first.
    order = {name: i for i, name in enumerate(labels, start=1)}
    out.items.sort(key=lambda p: order.get(p.field, 0))
    return out


def django_form_problems(form, *, prefix: str = "") -> FormProblems:
    """A bound Django form's errors, each under its field's label, linked to its input."""
    out = FormProblems(prefix=prefix or (form.prefix or "form"))
    for name, messages in form.errors.items():
        bound = form[name] if name in form.fields else None
        for message in messages:
            if bound is None:
                out.items.append(Problem("", "", message, ""))
            else:
                label = str(bound.label or name)
                out.items.append(Problem(name, label, message, bound.auto_id or ""))
    return out


def json_object_error(text: str) -> str | None:
    """Why `text` is not a JSON object, with the line and column of a syntax error (None when
    it is one). A trailing comma, the usual slip, is named as such."""
    try:
        value = json.loads(text)
    except RecursionError:
        return "nested too deeply to read"
    except json.JSONDecodeError as exc:
        before = text[: exc.pos].rstrip()
        if before.endswith(",") and exc.msg.startswith(("Expecting property name", "Expecting value")):
            what = "a comma with nothing after it (remove the trailing comma)"
        else:
            what = exc.msg[0].lower() + exc.msg[1:]
        return f"not valid JSON at line {exc.lineno}, column {exc.colno}: {what}"
    except ValueError:
        # Python refuses to read an integer of more than 4,300 digits (a guard against slow
        # conversions); the text is JSON, but no number in a setting is that long.
        return "holds a number too long to read (more than 4,300 digits)"
    if not isinstance(value, dict):
        return f"must be a JSON object ({{…}}), not {_json_kind(value)}"
    return None


def _json_kind(value) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    return "a number"
