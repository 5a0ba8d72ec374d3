"""One reader of a row id that arrives from outside (a query string, a form, a JSON body).

`str.isdigit()` is not that reader: it takes superscripts and other scripts' digits that
`int()` refuses (a 500), and a digit string of any length, which PostgreSQL's bigint cannot
hold (another 500). An id here is ASCII digits, at most 18 of them, or a non-negative int in
that range (never a bool)."""

from __future__ import annotations

import re

_ID = re.compile(r"[0-9]{1,18}")
MAX_ID = 10**18 - 1


def parse_id(value: object) -> int | None:
    """`value` as a row id, or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_ID else None
    if isinstance(value, str) and _ID.fullmatch(value):
        return int(value)
    return None


ID_REASON = "must be an id: a whole number from 1, in the digits 0 to 9"


def form_id(data, field: str) -> tuple[int | None, list[tuple[str, str]]]:
    """The id a form or query string gives in `field`: (the id, []) when it is one, (None, [])
    when the field is absent or blank, and (None, [(field, reason)]) otherwise — the error to
    show beside that field, never an `int()` that raises."""
    raw = data.get(field)
    text = raw.strip() if isinstance(raw, str) else raw
    if text in (None, ""):
        return None, []
    pk = parse_id(text)
    if pk is None or pk < 1:
        return None, [(field, ID_REASON)]
    return pk, []
