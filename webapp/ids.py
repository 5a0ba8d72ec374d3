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
