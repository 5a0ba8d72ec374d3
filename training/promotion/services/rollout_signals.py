"""The live signals of a progressive release: the candidate against the version it replaces,
on the conversations each served in the same window (since the step began), each with its
95 % interval, and the rule that reads them into a decision.

| signal | unit | better | default threshold |
|---|---|---|---|
| empty answers (no text but whitespace, no tool call) | delivered answer | lower | 0.05 |
| cut off at the token limit (`finish_reason` length) | delivered answer | lower | 0.05 |
| errors (the upstream failed the call) | answer | lower | 0.02 |
| undelivered (the client left before the answer came: `client_disconnect`) | answer | lower | 0.05 |
| unhappy customer ratings (thumbs down, 1-2 stars) | rated conversation | lower | 0.10 |
| graded success | graded conversation | higher | 0.05 |
| judge reward (mean; only while the deployment's judge passes its gate) | judged conversation | higher | 0.05 |
| latency (mean of delivered answers, relative to live's) | delivered answer | lower | 0.25 |

A rate's interval is Newcombe's for a difference of proportions; a mean's is Welch's normal
interval (latency's divided by live's mean, which is taken as known). Where live served no
answer in the window, a rate on answers is the candidate's share alone against the threshold
(Wilson's interval): an empty, failed, cut-off or undelivered answer is a fault on any
version. A gateway failure before the model answered (the upstream's 404 or 503: a replica
that has not loaded the adapter, no healthy replica) is the infrastructure's, not the
model's: it is left out of every signal and counted in `infra`.

The decision (`rollout_decision`), in this order:

- **roll back** when a signal is worse than its threshold beyond noise: its whole interval at
  99.99 % (`Z_ROLLBACK`, not 95 %: the check looks every 30 s at a growing sample, over eight
  signals) is past the threshold, on at least `MIN_ROLLBACK_N` of the candidate's items for
  that signal (so one or two unlucky answers never end a release; a broken candidate is still
  ended on its first dozen conversations, whatever the step's minimum);
- **wait** while the step's minimum (conversations the candidate served, at least 1; minutes)
  is not met, while the candidate has no data on a signal on answers (`ANSWER_SIGNALS`;
  latency only where live's answers have one), or
  while a signal's point estimate is past its threshold;
- **advance** otherwise: every signal is better, within its threshold, inconclusive but not
  worse than its threshold, or (ratings, grades, the judge, latency with no live answer) not
  measured on this traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.db.models import Avg, Count, F, Q

from feedback.models import Message, Trace
from feedback.selectors.judge_gate import judge_training_gate
from training.promotion.evaluation.metrics import Z_95, wilson_interval
from training.promotion.services.promotion_signals import Signal, difference_interval
from training.serving.models import Deployment

DEFAULT_THRESHOLDS: dict[str, float] = {
    "empty_rate": 0.05,
    "cutoff_rate": 0.05,
    "error_rate": 0.02,
    "undelivered_rate": 0.05,
    "unhappy_rate": 0.10,
    "success_rate": 0.05,
    "judge_reward": 0.05,
    "latency": 0.25,
}
LABELS = {
    "empty_rate": "Empty answers",
    "cutoff_rate": "Cut off at the token limit",
    "error_rate": "Errors",
    "undelivered_rate": "Undelivered (the client left first)",
    "unhappy_rate": "Unhappy customer ratings",
    "success_rate": "Graded success",
    "judge_reward": "Judge reward",
    "latency": "Latency (relative to live)",
}
_EMPTY = Q(content__regex=r"^\s*$") & (Q(tool_calls__isnull=True) | Q(tool_calls=[]))
_UNSEEN = ("error", "client_disconnect")  # a failed or undelivered answer: not empty, and no latency to read
# The upstream's answers that mean "no replica could take the call" (an adapter not yet
# loaded, none healthy), before the model produced anything: the infrastructure's failure.
INFRA_STATUSES = (404, 503)
_INFRA = (
    Q(finish_reason="error")
    & _EMPTY
    & Q(raw__practicum__error__status__in=INFRA_STATUSES)
    & Q(raw__practicum__error__mid_stream__isnull=True)
)
# Measured on every answer: a step never advances while the candidate has none of these.
ANSWER_SIGNALS = ("empty_rate", "cutoff_rate", "error_rate", "undelivered_rate", "latency")
# Rates on answers, read against the threshold as an absolute share where live served none.
_ABSOLUTE = ("empty_rate", "cutoff_rate", "error_rate", "undelivered_rate")
# A rollback needs this many of the candidate's items on the signal (answers, rated ...)
MIN_ROLLBACK_N = 10
# and the signal's whole interval at this level (99.99 %, two-sided) past its threshold: the
# repeated looks' correction (tests/promotion/test_rollout_rule.py simulates it).
Z_ROLLBACK = 3.89


@dataclass
class Side:
    """One version's traffic in the window."""

    conversations: int = 0
    answers: int = 0  # every answer but the infrastructure's failures
    delivered: int = 0  # answers the client received (not an error, not undelivered)
    undelivered: int = 0
    infra: int = 0  # gateway failures before the model answered (left out of the signals)
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
        infra=Count("id", filter=_INFRA),
        delivered=Count("id", filter=~Q(finish_reason__in=_UNSEEN)),
        undelivered=Count("id", filter=Q(finish_reason="client_disconnect")),
        empty=Count("id", filter=_EMPTY & ~Q(finish_reason__in=_UNSEEN)),
        cutoff=Count("id", filter=Q(finish_reason="length")),
        errors=Count("id", filter=Q(finish_reason="error")),
        latency_n=Count("id", filter=Q(latency_ms__isnull=False) & ~Q(finish_reason__in=_UNSEEN)),
        latency_mean=Avg("latency_ms", filter=~Q(finish_reason__in=_UNSEEN)),
        latency_sq=Avg(F("latency_ms") * F("latency_ms"), filter=~Q(finish_reason__in=_UNSEEN)),
    )
    m["answers"] -= m["infra"]
    m["errors"] -= m["infra"]
    return Side(**t, **m)


def _rate_signal(
    code: str, cand: Side, live: Side, num: str, den: str, threshold: float, *, higher: bool, z: float, min_n: int
) -> Signal:
    n_c, n_l = getattr(cand, den), getattr(live, den)
    c = getattr(cand, num) / n_c if n_c else None
    v = getattr(live, num) / n_l if n_l else None
    label, n = LABELS[code], f"n {n_c} / {n_l}"
    kw: dict[str, Any] = {"higher_is_better": higher, "threshold": threshold, "n": n}
    if c is None or (v is None and code not in _ABSOLUTE):
        why = "no traffic to measure it on" if not (n_c or n_l) else "measured on one side only"
        return Signal(code, label, "live traffic", c, v, unmeasured=why, **kw)
    few = f"fewer than {min_n} on the candidate's side" if n_c < min_n else ""
    if v is None:
        # No live answer in the window: the candidate's share alone, a fault on any version.
        low, high = (None, None) if few else wilson_interval(getattr(cand, num), n_c, z=z)
        note = "live served no answer in the window: the candidate's share against the threshold"
        return Signal(code, label, "the candidate alone", c, None, c, low, high, undecided=few, note=note, **kw)
    if few:
        return Signal(code, label, "live traffic", c, v, c - v, undecided=few, **kw)
    low, high = difference_interval(c, n_c, v, n_l, z=z)
    return Signal(code, label, "live traffic", c, v, c - v, low, high, **kw)


def _mean_interval(
    m_c: float, sq_c: float, n_c: int, m_l: float, sq_l: float, n_l: int, z: float
) -> tuple[float, float]:
    var_c = max(sq_c - m_c * m_c, 0.0) * n_c / max(n_c - 1, 1)
    var_l = max(sq_l - m_l * m_l, 0.0) * n_l / max(n_l - 1, 1)
    half = z * math.sqrt(var_c / n_c + var_l / n_l)
    d = m_c - m_l
    return d - half, d + half


def _mean_signal(
    code: str, c: tuple, v: tuple, threshold: float, *, higher: bool, relative: bool, z: float, min_n: int
) -> Signal:
    (m_c, sq_c, n_c), (m_l, sq_l, n_l) = c, v
    label, n = LABELS[code], f"n {n_c} / {n_l}"
    kw: dict[str, Any] = {"higher_is_better": higher, "threshold": threshold, "n": n}
    if not n_c or not n_l or m_c is None or m_l is None:
        why = "no traffic to measure it on" if not (n_c or n_l) else "measured on one side only"
        return Signal(code, label, "live traffic", m_c, m_l, unmeasured=why, **kw)
    if relative and m_l <= 0:
        return Signal(code, label, "live traffic", m_c, m_l, unmeasured="live's mean is 0", **kw)
    scale = m_l if relative else 1.0  # a relative threshold reads a relative difference, whatever the n
    if n_c < max(min_n, 2) or n_l < 2:
        few = (
            "fewer than 2 on a side: no interval"
            if n_c < 2 or n_l < 2
            else f"fewer than {min_n} on the candidate's side"
        )
        return Signal(code, label, "live traffic", m_c, m_l, (m_c - m_l) / scale, undecided=few, **kw)
    low, high = _mean_interval(m_c, sq_c, n_c, m_l, sq_l, n_l, z)
    return Signal(code, label, "live traffic", m_c, m_l, (m_c - m_l) / scale, low / scale, high / scale, **kw)


def rollout_signals(
    *,
    deployment: Deployment | None,
    cand: Side,
    live: Side,
    thresholds: dict[str, Any] | None = None,
    judge: bool | None = None,
    z: float = Z_95,
    min_n: int = 1,
) -> list[Signal]:
    """Every live signal, candidate against live, with intervals at `z`, none where the
    candidate has fewer than `min_n` items. `judge`: whether the judge's rewards count (None:
    whether the deployment's judge passes its training gate now)."""
    t = {**DEFAULT_THRESHOLDS, **{k: float(v) for k, v in (thresholds or {}).items() if k in DEFAULT_THRESHOLDS}}

    def rate(code: str, num: str, den: str, *, higher: bool = False) -> Signal:
        return _rate_signal(code, cand, live, num, den, t[code], higher=higher, z=z, min_n=min_n)

    def mean(code: str, c: tuple, v: tuple, *, higher: bool, relative: bool) -> Signal:
        return _mean_signal(code, c, v, t[code], higher=higher, relative=relative, z=z, min_n=min_n)

    errors = rate("error_rate", "errors", "answers")
    if cand.infra or live.infra:
        note = f"{cand.infra} / {live.infra} gateway failures before the model answered (404, 503) left out"
        errors = replace(errors, note=f"{errors.note}; {note}" if errors.note else note)
    signals = [
        rate("empty_rate", "empty", "delivered"),
        rate("cutoff_rate", "cutoff", "delivered"),
        errors,
        rate("undelivered_rate", "undelivered", "answers"),
        rate("unhappy_rate", "unhappy", "rated"),
        rate("success_rate", "success", "graded", higher=True),
    ]
    if cand.judged or live.judged:
        if judge is None:
            judge = judge_training_gate(deployment=deployment).allowed
        if judge:
            signals.append(
                mean(
                    "judge_reward",
                    (cand.reward_mean, cand.reward_sq, cand.judged),
                    (live.reward_mean, live.reward_sq, live.judged),
                    higher=True,
                    relative=False,
                )
            )
    signals.append(
        mean(
            "latency",
            (cand.latency_mean, cand.latency_sq, cand.latency_n),
            (live.latency_mean, live.latency_sq, live.latency_n),
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


def signal_sentence(signal: Signal, level: str = "95%") -> str:
    """A signal's figures in one line, for a reason in the audit log."""
    cand = "—" if signal.candidate is None else f"{signal.candidate:.3f}"
    live = "—" if signal.live is None else f"{signal.live:.3f}"
    delta = "" if signal.delta is None else f", Δ {signal.delta:+.3f}"
    ci = "" if signal.ci_low is None else f", {level} CI [{signal.ci_low:+.3f}, {signal.ci_high:+.3f}]"
    return f"{signal.label} {cand} vs live {live} ({signal.n}{delta}{ci}; threshold {signal.threshold:.2f})"


@dataclass
class Decision:
    action: str  # "advance", "wait" or "rollback"
    reason: str
    signals: list[Signal] = field(default_factory=list)


def rollout_decision(
    *, signals: list[Signal], strict: list[Signal], conversations: int, minutes: float, step: dict[str, Any]
) -> Decision:
    """Read the signals of one step into advance, wait or roll back (the module's rule):
    `signals` at 95 % (shown, and read for waiting), `strict` at the rollback's level."""
    bad = [s for s in strict if beyond_noise(s)]
    if bad:
        reason = "regressed beyond its threshold: " + "; ".join(signal_sentence(s, "99.99%") for s in bad)
        return Decision("rollback", reason, signals)
    # A plan stored before steps needed a minimum still waits for one conversation.
    need_n, need_min = max(int(step.get("min_conversations") or 0), 1), float(step.get("min_minutes") or 0)
    if conversations < need_n or minutes < need_min:
        return Decision(
            "wait",
            f"the step's minimum is not met: {conversations} of {need_n} conversations, "
            f"{minutes:.1f} of {need_min:g} minutes",
            signals,
        )
    # Latency is blind only where live's answers have one: traces may carry none at all.
    blind = [
        s.label
        for s in signals
        if s.code in ANSWER_SIGNALS and s.candidate is None and (s.code in _ABSOLUTE or s.live is not None)
    ]
    if blind:
        return Decision("wait", "no answer of the candidate's to measure: " + ", ".join(blind), signals)
    worse = [s for s in signals if worse_than_threshold(s)]
    if worse:
        return Decision(
            "wait", "worse than its threshold, within noise: " + "; ".join(map(signal_sentence, worse)), signals
        )
    read = ", ".join(f"{s.label.lower()} {s.status}" for s in signals)
    return Decision("advance", f"every signal at least inconclusive and not worse ({read})", signals)


def rollout_evaluate(
    *,
    deployment: Deployment | None,
    cand: Side,
    live: Side,
    step: dict[str, Any],
    minutes: float,
    thresholds: dict[str, Any] | None = None,
    judge: bool | None = None,
) -> Decision:
    """The decision on one window's two sides: the signals at 95 % and at the rollback's level."""
    if judge is None and (cand.judged or live.judged):
        judge = judge_training_gate(deployment=deployment).allowed
    kw = {"deployment": deployment, "cand": cand, "live": live, "thresholds": thresholds, "judge": judge}
    return rollout_decision(
        signals=rollout_signals(**kw),
        strict=rollout_signals(**kw, z=Z_ROLLBACK, min_n=MIN_ROLLBACK_N),
        conversations=cand.conversations,
        minutes=minutes,
        step=step,
    )
