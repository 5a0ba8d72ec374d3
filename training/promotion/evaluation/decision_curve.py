"""A decision curve: how often a version's turn right after a lookup calls the rule's action,
per value of the number the rule reads (for the support desk: P(refund) by days since
delivery), beside what the rule does. Pure: no database, no torch.

The stored shape (`curve_summary`), kept on an evaluation's summary as `decision_curve`:

    {"x_label": "days since delivery", "action": "issue_refund",
     "series": {"candidate": [[x, p, n], ...], "live": [[x, p, n], ...]},
     "statuses": {"candidate": {"shipped": [p, n], ...}, "live": {...}},
     "rule": {"threshold": 30, "status": "delivered"},
     "agreement": {"candidate": {"rate", "count", "n"}, "live": {...}},
     "per_point": 2}

`p` is the share of the `n` held-out contexts at that point whose generated turn called the
action (decoded as the evaluation decodes: greedily unless it sets a temperature, so with
greedy decoding the share is over contexts — other customers, orders and wordings — not over
samples). `agreement` is the share of every context, statuses included, where the turn did
what the rule does. A version that learned the rule draws a step down just after the
threshold and nowhere before it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from training.environments.base import DecisionContext, DecisionCurve
from training.inference.codec import message_text


def calls_action(message: dict[str, Any], action: str) -> bool:
    """Whether a generated turn calls `action`: a parsed tool call of that name, or a tool-call
    block in the text that names it (one cut off by the token limit included)."""
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and function.get("name") == action:
            return True
    text = message_text(message)
    return re.search(r'<tool_call>\s*\{\s*"name"\s*:\s*"' + re.escape(action) + '"', text) is not None


def curve_summary(
    *, curve: DecisionCurve, contexts: Sequence[DecisionContext], acts: dict[str, Sequence[bool]], per_point: int
) -> dict[str, Any]:
    """The stored curve from each side's decisions (`acts[side][i]`: the turn at `contexts[i]`
    called the action)."""
    series: dict[str, list[list[Any]]] = {}
    statuses: dict[str, dict[str, list[Any]]] = {}
    agreement: dict[str, dict[str, Any]] = {}
    for side, decisions in acts.items():
        by_x: dict[int, list[bool]] = {}
        by_status: dict[str, list[bool]] = {}
        for context, acted in zip(contexts, decisions, strict=True):
            if context.status == curve.status and context.x is not None:
                by_x.setdefault(context.x, []).append(bool(acted))
            else:
                by_status.setdefault(context.status, []).append(bool(acted))
        series[side] = [[x, sum(v) / len(v), len(v)] for x, v in sorted(by_x.items())]
        statuses[side] = {status: [sum(v) / len(v), len(v)] for status, v in by_status.items()}
        agree = sum(1 for c, a in zip(contexts, decisions, strict=True) if bool(a) == c.acts)
        agreement[side] = {"rate": agree / len(contexts) if contexts else None, "count": agree, "n": len(contexts)}
    return {
        "x_label": curve.x_label,
        "action": curve.action,
        "series": series,
        "statuses": statuses,
        "rule": {"threshold": curve.threshold, "status": curve.status},
        "agreement": agreement,
        "per_point": per_point,
    }


def rule_step(series: Sequence[Sequence[Any]], threshold: float) -> tuple[float | None, float | None]:
    """(mean P at or below the threshold, mean P above it) over a series' points: the two
    sides of the step a version that learned the rule draws (near 1, then near 0)."""
    within = [p for x, p, _n in series if x <= threshold]
    past = [p for x, p, _n in series if x > threshold]
    return (sum(within) / len(within) if within else None, sum(past) / len(past) if past else None)
