"""Charts: the specs the pages hand to `static/js/charts.js` (drawn with the vendored uPlot:
axes, hover values, several lines, markers), and a small server-rendered SVG line for the
promotion page's signal curves.

A spec is plain data, put in the page with `json_script` (the Content-Security-Policy runs
no inline script, and json_script escapes it); the SVG's only text (title, labels) is
escaped, so it is safe to mark safe."""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape
from typing import Any


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.01:
        return f"{value:.2e}"
    return f"{value:.3g}"


def downsample(points: list[tuple[float, float]], limit: int = 300) -> list[tuple[float, float]]:
    """Every k-th point (and the last), so a long job draws at most `limit` points."""
    if len(points) <= limit:
        return points
    stride = math.ceil(len(points) / limit)
    out = points[::stride]
    return out if out[-1] == points[-1] else [*out, points[-1]]


def line_chart(
    points: list[tuple[float, float]],
    *,
    title: str,
    band: list[tuple[float, float, float]] | None = None,
    width: int = 320,
    height: int = 150,
    color: str = "#3056d3",
) -> str:
    """An SVG line chart of (x, y) points, with an optional shaded band (x, low, high)
    such as mean ± std. Non-finite values are skipped."""
    points = downsample([(x, y) for x, y in points if y is not None and math.isfinite(y)])
    band = downsample_band(band or [])
    if not points:
        return _no_data(title, width=width, height=height, svg_height=height)
    xs = [p[0] for p in points] + [b[0] for b in band]
    ys = [p[1] for p in points] + [v for b in band for v in b[1:]]
    axes, sx, sy = _axes(min(xs), max(xs), min(ys), max(ys), width=width, height=height)
    parts = [_svg_open(title, width=width, svg_height=height), axes]
    if band:
        upper = " ".join(f"{sx(x):.1f},{sy(hi):.1f}" for x, _, hi in band)
        lower = " ".join(f"{sx(x):.1f},{sy(lo):.1f}" for x, lo, _ in reversed(band))
        parts.append(f'<polygon points="{upper} {lower}" fill="{color}" fill-opacity="0.15" stroke="none"/>')
    line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    last_x, last_y = points[-1]
    parts.append(f'<circle cx="{sx(last_x):.1f}" cy="{sy(last_y):.1f}" r="2.5" fill="{color}"/>')
    parts.append(
        f'<text x="{width - PAD_R}" y="13" text-anchor="end" class="chart-label">last {_fmt(last_y)}</text></svg>'
    )
    return "".join(parts)


def downsample_band(band: list[tuple[float, float, float]], limit: int = 300) -> list[tuple[float, float, float]]:
    band = [b for b in band if all(v is not None and math.isfinite(v) for v in b)]
    if len(band) <= limit:
        return band
    stride = math.ceil(len(band) / limit)
    return band[::stride]


# Plot-area padding: left (room for the y labels), right, top (the title), bottom (x labels).
PAD_L, PAD_R, PAD_T, PAD_B = 44, 8, 20, 18


PALETTE = ("#3056d3", "#d9480f", "#2b8a3e", "#862e9c", "#c92a2a", "#1098ad", "#e67700", "#5c940d")


def series_chart(
    series: list[tuple[str, list[tuple[float, float]]]],
    *,
    title: str,
    y_range: tuple[float, float] | None = None,
    width: int = 640,
    height: int = 200,
    x_range: tuple[float, float] | None = None,
    markers: list[tuple[float, str]] | None = None,
) -> str:
    """Drawn on the server, as an SVG (for a small chart that must read without scripts,
    such as the decision curve): several (x, y) series on shared axes, each in its own colour with a legend entry
    (label, point count and last value). `y_range` fixes the y axis (e.g. (0, 1) for
    rates), and `x_range` the x axis. `markers` draws a dashed vertical line at each x with its label (e.g. a
    version change). Labels are escaped; non-finite values are skipped."""
    series = [
        (label, downsample([(x, y) for x, y in pts if y is not None and math.isfinite(y)])) for label, pts in series
    ]
    series = [(label, pts) for label, pts in series if pts]
    markers = [(x, label) for x, label in markers or [] if math.isfinite(x)]
    svg_height = height + 16 * len(series)  # a legend line per series
    if not series and not markers:
        return _no_data(title, width=width, height=height, svg_height=svg_height)
    xs = [x for _, pts in series for x, _ in pts] + [x for x, _ in markers]
    ys = [y for _, pts in series for _, y in pts] or [0.0, 1.0]
    x0, x1 = x_range if x_range else (min(xs), max(xs))
    y0, y1 = y_range if y_range else (min(ys), max(ys))
    axes, sx, sy = _axes(x0, x1, y0, y1, width=width, height=height)
    parts = [_svg_open(title, width=width, svg_height=svg_height), axes]
    if not series:  # the events still show when they happened
        parts.append(
            f'<text x="{PAD_L + 8}" y="{PAD_T + (height - PAD_T - PAD_B) / 2:.0f}" class="chart-empty">no data yet</text>'
        )
    for k, (x, label) in enumerate(markers):
        mx = sx(x)
        # Labels alternate between two heights so that changes on nearby days stay readable,
        # and sit left of their line in the right half, where they would run off the chart.
        lx, anchor = (mx - 2, "end") if mx > width / 2 else (mx + 2, "start")
        parts.append(
            f'<line x1="{mx:.1f}" y1="{PAD_T}" x2="{mx:.1f}" y2="{height - PAD_B}" class="chart-marker" '
            f'stroke="#868e96" stroke-dasharray="3,3"/>'
            f'<text x="{lx:.1f}" y="{PAD_T + 10 + 11 * (k % 2)}" text-anchor="{anchor}" '
            f'class="chart-label chart-marker-label">{escape(label)}</text>'
        )
    for k, (label, pts) in enumerate(series):
        color = PALETTE[k % len(PALETTE)]
        line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        parts.append(f'<polyline points="{line}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        parts.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="1.8" fill="{color}"/>' for x, y in pts)
        ly = height + 12 + 16 * k
        parts.append(
            f'<rect x="{PAD_L}" y="{ly - 8}" width="10" height="10" fill="{color}"/>'
            f'<text x="{PAD_L + 16}" y="{ly}" class="chart-label chart-legend">{escape(label)} '
            f"({len(pts)} points, last {_fmt(pts[-1][1])})</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _svg_open(title: str, *, width: int, svg_height: int) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {width} {svg_height}" width="{width}" height="{svg_height}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        f'<text x="{PAD_L}" y="13" class="chart-title">{escape(title)}</text>'
    )


def _no_data(title: str, *, width: int, height: int, svg_height: int) -> str:
    inner_h = height - PAD_T - PAD_B
    return (
        _svg_open(title, width=width, svg_height=svg_height)
        + f'<text x="{PAD_L}" y="{PAD_T + inner_h / 2:.0f}" class="chart-empty">no data yet</text></svg>'
    )


def _axes(
    x0: float,
    x1: float,
    y0: float,
    y1: float,
    *,
    width: int,
    height: int,
) -> tuple[str, Callable[[float], float], Callable[[float], float]]:
    """The axes, labelled with their ends, for data spanning x0..x1 and y0..y1 (a zero span is
    widened so a single point still draws), and the maps from data to drawing coordinates."""
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    inner_w, inner_h = width - PAD_L - PAD_R, height - PAD_T - PAD_B
    first, last = _fmt(x0), _fmt(x1)

    def sx(x: float) -> float:
        return PAD_L + (x - x0) / (x1 - x0) * inner_w

    def sy(y: float) -> float:
        return PAD_T + (1 - (y - y0) / (y1 - y0)) * inner_h

    svg = (
        f'<line x1="{PAD_L}" y1="{PAD_T + inner_h}" x2="{PAD_L + inner_w}" y2="{PAD_T + inner_h}" class="chart-axis"/>'
        f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{PAD_T + inner_h}" class="chart-axis"/>'
        f'<text x="{PAD_L - 4}" y="{PAD_T + 4}" text-anchor="end" class="chart-label">{_fmt(y1)}</text>'
        f'<text x="{PAD_L - 4}" y="{PAD_T + inner_h}" text-anchor="end" class="chart-label">{_fmt(y0)}</text>'
        f'<text x="{PAD_L}" y="{height - 4}" class="chart-label">{first}</text>'
        f'<text x="{PAD_L + inner_w}" y="{height - 4}" text-anchor="end" class="chart-label">{last}</text>'
    )
    return svg, sx, sy


MAX_SPEC_POINTS = 500


def chart_spec(
    *,
    chart_id: str,
    title: str,
    series: list[dict[str, Any]],
    x: dict[str, Any],
    y: dict[str, Any] | None = None,
    markers: list[dict[str, Any]] | None = None,
    kind: str = "line",
    height: int = 220,
) -> dict[str, Any]:
    """A chart for `static/js/charts.js`. `series`: [{"label", "points": [(x, y)], "band"?:
    [(x, low, high)], "dash"?: bool}] (non-finite values left out, each line cut to at most
    MAX_SPEC_POINTS points); `x`: {"label", "kind": "step" | "index" | "day" (x in Unix
    seconds), "range"?: (low, high), "elapsed"?: {step: seconds}}; `y`: {"label", "format":
    "number" | "percent" | "int", "range"?: (low, high)}; `markers`: [{"x", "label"}] drawn
    as dashed vertical lines; `kind`: "line" or "bars". `summary` says in words what it shows
    (the last value of each line), for screen readers and pages without scripts."""
    drawn = []
    for s in series:
        points = downsample(
            [(float(px), float(py)) for px, py in s["points"] if py is not None and math.isfinite(py)],
            MAX_SPEC_POINTS,
        )
        item = {"label": s["label"], "points": points, "dash": bool(s.get("dash"))}
        if s.get("band"):
            item["band"] = downsample_band(s["band"], MAX_SPEC_POINTS)
        drawn.append(item)
    y = {"label": "", "format": "number", **(y or {})}
    words = [
        f"{s['label']}: {len(s['points'])} point{'s' if len(s['points']) != 1 else ''}, last "
        + _spoken(s["points"][-1][1], y["format"])
        for s in drawn
        if s["points"]
    ]
    return {
        "id": chart_id,
        "title": title,
        "kind": kind,
        "height": height,
        "x": x,
        "y": y,
        "series": drawn,
        "markers": [m for m in markers or [] if math.isfinite(m["x"])],
        "summary": f"{title}. " + ("; ".join(words) if words else "No data yet."),
    }


def _spoken(value: float, fmt: str) -> str:
    if fmt == "percent":
        return f"{value:.0%}"
    if fmt == "int":
        return f"{value:.0f}"
    return _fmt(value)
