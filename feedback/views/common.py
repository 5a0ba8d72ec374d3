"""What the feedback pages share beyond webapp/kernel/pages.py: the trace list's filter in links."""

from __future__ import annotations

from urllib.parse import urlencode

from django.http import QueryDict

from feedback.forms import FILTER_FIELDS


def filter_query(params: QueryDict) -> str:
    """The filter part of a list URL's query string (no cursor), for links that keep it."""
    pairs = [(k, v) for k in FILTER_FIELDS for v in params.getlist(k) if v != ""]
    return urlencode(pairs)
