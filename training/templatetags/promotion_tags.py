"""Template filters for the evaluation and promotion pages."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.safestring import mark_safe

from feedback.selectors.review import json_pretty
from training.charts import line_chart, series_chart
from webapp.kernel.chat_format import json_loads_bounded

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
    if not points:
        return ""
    return mark_safe(line_chart([(float(x), float(y)) for x, y in points], title=title, width=260, height=110))


@register.filter
def by_code(signals: Any, code: str) -> Any:
    """The signal with `code` from a list of signals, or None."""
    return next((s for s in signals or [] if getattr(s, "code", None) == code), None)


def _curve_points(points: Any) -> list[tuple[float, float, int]]:
    """[x, p, n] rows of a decision curve, numbers only (anything else is dropped)."""
    out = []
    for row in points if isinstance(points, list) else []:
        if isinstance(row, list | tuple) and len(row) >= 2 and all(_number(v) is not None for v in row[:2]):
            n = row[2] if len(row) > 2 and _number(row[2]) is not None else 0
            out.append((float(row[0]), float(row[1]), int(n)))
    return sorted(out)


@register.filter
def decision_curve_rows(curve: Any) -> list[dict[str, Any]]:
    """The curve's points side by side, one row per x: {x, candidate: (p, n), live: (p, n)}."""
    series = (curve or {}).get("series") if isinstance(curve, dict) else None
    if not isinstance(series, dict):
        return []
    rows: dict[float, dict[str, Any]] = {}
    for side in ("candidate", "live"):
        for x, p, n in _curve_points(series.get(side)):
            rows.setdefault(x, {"x": x})[side] = {"p": p, "n": n}
    return [rows[x] for x in sorted(rows)]


@register.filter
def decision_curve_svg(curve: Any) -> str:
    """The candidate's and the live version's decision curves on one chart (P of the action
    against the rule's variable), with the rule's threshold as a marker. Numbers only; the
    labels are escaped."""
    if not isinstance(curve, dict) or not isinstance(curve.get("series"), dict):
        return ""
    series = [
        (side, [(x, p) for x, p, _ in _curve_points(curve["series"].get(side))]) for side in ("candidate", "live")
    ]
    xs = [x for _, pts in series for x, _ in pts]
    if not xs:
        return ""
    threshold = _number(((curve.get("rule") or {}) if isinstance(curve.get("rule"), dict) else {}).get("threshold"))
    markers = [(threshold, f"rule: {threshold:g}")] if threshold is not None else []
    x_label = str(curve.get("x_label") or "x")
    return mark_safe(
        series_chart(
            series,
            title=f"P(action) by {x_label}",
            y_range=(0.0, 1.0),
            x_range=(min(xs + [m for m, _ in markers]), max(xs + [m for m, _ in markers])),
            markers=markers,
            width=560,
            height=200,
        )
    )
