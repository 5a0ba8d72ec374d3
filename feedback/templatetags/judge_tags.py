"""Template filters for the judge's pages."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.filter
def lookup(mapping: Any, key: Any) -> Any:
    """`mapping[key]`, or None: `{{ judgements|lookup:message.id }}`."""
    if not isinstance(mapping, dict):
        return None
    return mapping.get(key)


@register.filter
def ratio(value: float | None, digits: int = 2) -> str:
    """A statistic for display: '—' when undefined."""
    if value is None:
        return "—"
    return f"{value:.{int(digits)}f}"


@register.filter
def reward_class(value: float | None) -> str:
    """A CSS class for a reward in [0, 1], by how good it is: low (< 0.4) red, mid amber,
    high (>= 0.7) green; none when there is no reward."""
    if value is None:
        return "reward-none"
    if value >= 0.7:
        return "reward-high"
    if value >= 0.4:
        return "reward-mid"
    return "reward-low"
