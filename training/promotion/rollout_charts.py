"""The release page's charts, drawn on the server (`training.charts.series_chart`, escaped SVG):
the candidate's share over time with a marker at each change, and per signal both versions'
values at each check with the 95 % interval of their difference. `series_chart` escapes every
label it draws (a version's name, a person's), so its SVG is marked safe here."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils.safestring import mark_safe

from training.charts import series_chart
from training.promotion.rollout_models import Rollout
from training.promotion.services.rollout_signals import LABELS


def _minutes(rollout: Rollout, at: datetime | str) -> float:
    if isinstance(at, str):
        at = datetime.fromisoformat(at)
    return (at - rollout.started_at).total_seconds() / 60


def rollout_charts(rollout: Rollout) -> list[dict[str, Any]]:
    changes = list(rollout.changes.all())
    share = [(_minutes(rollout, c.at), 100 * (c.to_share or 0.0)) for c in changes]
    if share and rollout.active:
        share.append((_minutes(rollout, rollout.checked_at or changes[-1].at), share[-1][1]))
    markers = [(_minutes(rollout, c.at), f"{c.actor_name}: {c.get_to_state_display().lower()}") for c in changes[1:]]
    charts = [
        {
            "code": "share",
            "svg": mark_safe(
                series_chart(
                    [("candidate's share (%)", share)],
                    title="Share of conversations over time (minutes since approval)",
                    y_range=(0, 100),
                    markers=markers,
                )
            ),
        }
    ]
    checks = rollout.checks or []
    for code, label in LABELS.items():
        rows = [(_minutes(rollout, c["at"]), c["signals"][code]) for c in checks if code in c.get("signals", {})]
        if not any(v[0] is not None or v[1] is not None for _, v in rows):
            continue  # not measured at any check: nothing to draw
        charts.append(
            {
                "code": code,
                "svg": mark_safe(
                    series_chart(
                        [
                            ("candidate", [(x, v[0]) for x, v in rows]),
                            ("live", [(x, v[1]) for x, v in rows]),
                            ("difference, 95 % low", [(x, v[2]) for x, v in rows]),
                            ("difference, 95 % high", [(x, v[3]) for x, v in rows]),
                        ],
                        title=f"{label} at each check",
                        markers=markers,
                    )
                ),
            }
        )
    return charts
