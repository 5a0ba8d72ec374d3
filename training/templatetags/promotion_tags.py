"""Template filters for the evaluation and promotion pages."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


def _number(value: Any) -> float | None:
    # A missing key reaches a filter as "" (the template engine's invalid-variable value).
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@register.filter
def pct(value: float | None, digits: int = 0) -> str:
    """A share as a percentage: 0.754 → '75%'; '—' when undefined."""
    value = _number(value)
    if value is None:
        return "—"
    return f"{100 * value:.{int(digits)}f}%"


@register.filter
def num(value: float | None, digits: int = 2) -> str:
    value = _number(value)
    if value is None:
        return "—"
    return f"{value:.{int(digits)}f}"


@register.filter
def signed(value: float | None, digits: int = 2) -> str:
    value = _number(value)
    if value is None:
        return "—"
    return f"{value:+.{int(digits)}f}"


@register.filter
def interval(value: Any, digits: int = 3) -> str:
    """A (mean, low, high) triple as '0.573 [0.441, 0.705]'; the mean alone when the interval
    has no width (one seed); '—' when undefined."""
    if not isinstance(value, tuple | list) or len(value) != 3 or any(_number(v) is None for v in value):
        return "—"
    mean, low, high = (float(v) for v in value)
    d = int(digits)
    return f"{mean:.{d}f}" if low == high else f"{mean:.{d}f} [{low:.{d}f}, {high:.{d}f}]"


@register.filter
def pretty(value: Any) -> str:
    """JSON for a <pre>: tool-call arguments, rubrics, raw results (escaped by the template)."""
    from feedback.selectors.review import json_pretty
    from feedback.services.chat_format import json_loads_bounded

    # Values come from traces and model output: one nested too deeply never breaks the page.
    if isinstance(value, str):
        try:
            value = json_loads_bounded(value)
        except ValueError:
            return value
    return json_pretty(value, sort_keys=True)


@register.filter
def text_of(message: Any) -> str:
    """A chat message's text (content parts joined)."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


@register.filter
def pair(first: Any, second: Any) -> list[Any]:
    """Two values to loop over side by side (`{% for x in a|pair:b %}`); a missing one as {}."""
    return [first or {}, second or {}]


@register.filter
def get(mapping: Any, key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None


@register.filter
def is_blank(text: Any) -> bool:
    return not str(text or "").strip()


@register.filter
def curve_svg(points: Any, title: str = "") -> str:
    """A small line chart of (step, value) points (numbers only; the title is escaped)."""
    from django.utils.safestring import mark_safe

    from training.charts import line_chart

    if not points:
        return ""
    return mark_safe(line_chart([(float(x), float(y)) for x, y in points], title=title, width=260, height=110))
