"""The live signals of a progressive release: the candidate against the version it replaces,
on the conversations each served in the same window (since the step began), each with its
95 % interval, and the rule that reads them into a decision.

| signal | unit | better | default threshold |
|---|---|---|---|
| empty answers (no text but whitespace, no tool call) | answer | lower | 0.05 |
| cut off at the token limit (`finish_reason` length) | answer | lower | 0.05 |
| errors (the upstream failed the call) | answer | lower | 0.02 |
| unhappy customer ratings (thumbs down, 1-2 stars) | rated conversation | lower | 0.10 |
| graded success | graded conversation | higher | 0.05 |
| judge reward (mean; only while the deployment's judge passes its gate) | judged conversation | higher | 0.05 |
| latency (mean, relative to live's) | answer | lower | 0.25 |

A rate's interval is Newcombe's for a difference of proportions; a mean's is Welch's normal
interval (latency's divided by live's mean, which is taken as known).

The decision (`rollout_decision`), in this order:

- **roll back** when a signal is worse than its threshold beyond noise: its whole interval
  is past the threshold (so a couple of unlucky answers in the first minutes do not end a
  release, and a broken candidate ends it on its first handful of conversations, whatever
  the step's minimum);
- **wait** while the step's minimum (conversations the candidate served, minutes) is not met,
  or while a signal's point estimate is past its threshold within noise;
- **advance** otherwise: every signal is better, within its threshold, inconclusive but not
  worse than its threshold, or not measured on this traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Avg, Count, F, Q

from feedback.models import Message, Trace
from feedback.selectors.judge_gate import judge_training_gate
from training.evaluation.metrics import Z_95
from training.services.promotion_signals import Signal, difference_interval
from training.serving.models import Deployment

DEFAULT_THRESHOLDS: dict[str, float] = {
    "empty_rate": 0.05,
    "cutoff_rate": 0.05,
    "error_rate": 0.02,
    "unhappy_rate": 0.10,
    "success_rate": 0.05,
    "judge_reward": 0.05,
    "latency": 0.25,
}
LABELS = {
    "empty_rate": "Empty answers",
    "cutoff_rate": "Cut off at the token limit",
    "error_rate": "Errors",
    "unhappy_rate": "Unhappy customer ratings",
    "success_rate": "Graded success",
    "judge_reward": "Judge reward",
    "latency": "Latency (relative to live)",
}
_EMPTY = Q(content__regex=r"^\s*$") & (Q(tool_calls__isnull=True) | Q(tool_calls=[]))
_UNSEEN = ("error", "client_disconnect")  # a failed or undelivered answer: counted as an error, not as empty


@dataclass
class Side:
    """One version's traffic in the window."""

    conversations: int = 0
    answers: int = 0
    empty: int = 0
    cutoff: int = 0
    errors: int = 0
    latency_mean: float | None = None
    latency_sq: float | None = None
    latency_n: int = 0
    rated: int = 0
    unhappy: int = 0
    graded: int = 0
    success: int = 0
    judged: int = 0
    reward_mean: float | None = None
    reward_sq: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def side_measure(*, deployment_id: int, version_id: int, since: datetime, until: datetime) -> Side:
    """What `version` served of the deployment's conversations that began in [since, until]."""
    traces = Trace.objects.filter(
        deployment_id=deployment_id, model_version_id=version_id, started_at__gte=since, started_at__lte=until
    )
    t = traces.aggregate(
        conversations=Count("id"),
        rated=Count("id", filter=Q(feedback_rating__isnull=False)),
        unhappy=Count("id", filter=Q(feedback_rating__lt=0)),
        graded=Count("id", filter=Q(outcome__in=["success", "failure"])),
        success=Count("id", filter=Q(outcome="success")),
        judged=Count("id", filter=Q(judge_reward__isnull=False)),
        reward_mean=Avg("judge_reward"),
        reward_sq=Avg(F("judge_reward") * F("judge_reward")),
    )
    answers = Message.objects.filter(
        trace__in=traces, role="assistant", model_version_id=version_id, created_at__gte=since
    )
    m = answers.aggregate(
        answers=Count("id"),
        empty=Count("id", filter=_EMPTY & ~Q(finish_reason__in=_UNSEEN)),
        cutoff=Count("id", filter=Q(finish_reason="length")),
        errors=Count("id", filter=Q(finish_reason="error")),
        latency_n=Count("id", filter=Q(latency_ms__isnull=False) & ~Q(finish_reason__in=_UNSEEN)),
        latency_mean=Avg("latency_ms", filter=~Q(finish_reason__in=_UNSEEN)),
        latency_sq=Avg(F("latency_ms") * F("latency_ms"), filter=~Q(finish_reason__in=_UNSEEN)),
    )
    return Side(**t, **m)


def _rate_signal(code: str, cand: Side, live: Side, num: str, den: str, threshold: float, *, higher: bool) -> Signal:
    n_c, n_l = getattr(cand, den), getattr(live, den)
    c = getattr(cand, num) / n_c if n_c else None
    v = getattr(live, num) / n_l if n_l else None
    label, n = LABELS[code], f"n {n_c} / {n_l}"
    if c is None or v is None:
        why = "no traffic to measure it on" if not (n_c or n_l) else "measured on one side only"
        return Signal(
            code, label, "live traffic", c, v, threshold=threshold, higher_is_better=higher, n=n, unmeasured=why
        )
    low, high = difference_interval(c, n_c, v, n_l)
    return Signal(code, label, "live traffic", c, v, c - v, low, high, higher, threshold, n=n)


def _mean_interval(m_c: float, sq_c: float, n_c: int, m_l: float, sq_l: float, n_l: int) -> tuple[float, float]:
    var_c = max(sq_c - m_c * m_c, 0.0) * n_c / max(n_c - 1, 1)
    var_l = max(sq_l - m_l * m_l, 0.0) * n_l / max(n_l - 1, 1)
    half = Z_95 * math.sqrt(var_c / n_c + var_l / n_l)
    d = m_c - m_l
    return d - half, d + half


def _mean_signal(code: str, c: tuple, v: tuple, threshold: float, *, higher: bool, relative: bool) -> Signal:
    (m_c, sq_c, n_c), (m_l, sq_l, n_l) = c, v
    label, n = LABELS[code], f"n {n_c} / {n_l}"
    if not n_c or not n_l or m_c is None or m_l is None:
        why = "no traffic to measure it on" if not (n_c or n_l) else "measured on one side only"
        return Signal(
            code, label, "live traffic", m_c, m_l, threshold=threshold, higher_is_better=higher, n=n, unmeasured=why
        )
    if n_c < 2 or n_l < 2:
        return Signal(
            code, label, "live traffic", m_c, m_l, m_c - m_l, higher_is_better=higher, threshold=threshold, n=n,
            undecided="fewer than 2 on a side: no interval",
        )  # fmt: skip
    low, high = _mean_interval(m_c, sq_c, n_c, m_l, sq_l, n_l)
    delta = m_c - m_l
    if relative:
        if m_l <= 0:
            return Signal(
                code,
                label,
                "live traffic",
                m_c,
                m_l,
                threshold=threshold,
                higher_is_better=higher,
                n=n,
                unmeasured="live's mean is 0",
            )
        delta, low, high = delta / m_l, low / m_l, high / m_l
    return Signal(code, label, "live traffic", m_c, m_l, delta, low, high, higher, threshold, n=n)


def rollout_signals(
    *,
    deployment: Deployment,
    cand: Side,
    live: Side,
    thresholds: dict[str, Any] | None = None,
    judge: bool | None = None,
) -> list[Signal]:
    """Every live signal, candidate against live. `judge`: whether the judge's rewards count
    (None: whether the deployment's judge passes its training gate now)."""
    t = {**DEFAULT_THRESHOLDS, **{k: float(v) for k, v in (thresholds or {}).items() if k in DEFAULT_THRESHOLDS}}
    signals = [
        _rate_signal("empty_rate", cand, live, "empty", "answers", t["empty_rate"], higher=False),
        _rate_signal("cutoff_rate", cand, live, "cutoff", "answers", t["cutoff_rate"], higher=False),
        _rate_signal("error_rate", cand, live, "errors", "answers", t["error_rate"], higher=False),
        _rate_signal("unhappy_rate", cand, live, "unhappy", "rated", t["unhappy_rate"], higher=False),
        _rate_signal("success_rate", cand, live, "success", "graded", t["success_rate"], higher=True),
    ]
    if cand.judged or live.judged:
        if judge is None:
            judge = judge_training_gate(deployment=deployment).allowed
        if judge:
            signals.append(
                _mean_signal(
                    "judge_reward",
                    (cand.reward_mean, cand.reward_sq, cand.judged),
                    (live.reward_mean, live.reward_sq, live.judged),
                    t["judge_reward"],
                    higher=True,
                    relative=False,
                )
            )
    signals.append(
        _mean_signal(
            "latency",
            (cand.latency_mean, cand.latency_sq, cand.latency_n),
            (live.latency_mean, live.latency_sq, live.latency_n),
            t["latency"],
            higher=False,
            relative=True,
        )
    )
    return signals


def beyond_noise(signal: Signal) -> bool:
    """Worse than its threshold by its whole interval: the check runs every few seconds on a
    growing sample, so an interval that merely leaves out "no change" would end good releases
    by chance; one that leaves out every change within the threshold is a regression."""
    high = signal.gain_interval[1]
    if signal.unmeasured or signal.gain is None or signal.threshold is None or high is None:
        return False
    return high < -signal.threshold - 1e-12


def worse_than_threshold(signal: Signal) -> bool:
    gain = signal.gain
    return (
        not signal.unmeasured and gain is not None and signal.threshold is not None and gain < -signal.threshold - 1e-12
    )


def signal_sentence(signal: Signal) -> str:
    """A signal's figures in one line, for a reason in the audit log."""
    cand = "—" if signal.candidate is None else f"{signal.candidate:.3f}"
    live = "—" if signal.live is None else f"{signal.live:.3f}"
    delta = "" if signal.delta is None else f", Δ {signal.delta:+.3f}"
    ci = "" if signal.ci_low is None else f", 95% CI [{signal.ci_low:+.3f}, {signal.ci_high:+.3f}]"
    return f"{signal.label} {cand} vs live {live} ({signal.n}{delta}{ci}; threshold {signal.threshold:.2f})"


@dataclass
class Decision:
    action: str  # "advance", "wait" or "rollback"
    reason: str
    signals: list[Signal] = field(default_factory=list)


def rollout_decision(*, signals: list[Signal], conversations: int, minutes: float, step: dict[str, Any]) -> Decision:
    """Read the signals of one step into advance, wait or roll back (the module's rule)."""
    bad = [s for s in signals if beyond_noise(s)]
    if bad:
        return Decision("rollback", "regressed beyond its threshold: " + "; ".join(map(signal_sentence, bad)), signals)
    need_n, need_min = int(step.get("min_conversations") or 0), float(step.get("min_minutes") or 0)
    if conversations < need_n or minutes < need_min:
        return Decision(
            "wait",
            f"the step's minimum is not met: {conversations} of {need_n} conversations, "
            f"{minutes:.1f} of {need_min:g} minutes",
            signals,
        )
    worse = [s for s in signals if worse_than_threshold(s)]
    if worse:
        return Decision(
            "wait", "worse than its threshold, within noise: " + "; ".join(map(signal_sentence, worse)), signals
        )
    read = ", ".join(f"{s.label.lower()} {s.status}" for s in signals)
    return Decision("advance", f"every signal at least inconclusive and not worse ({read})", signals)
