"""The verdict an approver reads first: what the evidence of a promotion request settles and
what it leaves open, from the figures the page shows below it.

Grouped so that nothing reads as a pass by being left out:

- **samples**: how many items, episodes, judged pairs and graded answers the figures rest on;
- **blocked**: preconditions that do not hold (approval is refused);
- **regressed**: signals past their threshold (a harm signal's rise blocks; another needs
  the requester's reason, shown under **overridden**);
- **inconclusive**: signals whose interval spans their threshold, or too few items to decide;
- **not measured**: signals with nothing measured (no answer judged, no episodes);
- **unverified**: figures that rest on something not checked (the judge's rewards while its
  agreement with operators blocks its use for training);
- **red flags**: what the candidate's answers look like when something is broken (empty or
  cut-off answers, generation errors, failed judge calls).

`level` is "blocked", "waiting" (the evaluation has not finished), "caution" (anything
open, regressed under an override or flagged) or "clear" (every signal measured and
conclusive, none regressed, nothing flagged).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from training.promotion.models import Evaluation
from training.promotion.services.promotion_checks import Precondition
from training.promotion.services.promotion_signals import KIND_PREFIX, Signal, SignalStatus
from webapp.kernel.work import WorkStatus

# A candidate's share of empty or cut-off answers from which it is a red flag: a few cut
# answers are a length limit; one in ten is a broken model or a prompt it cannot read.
RED_FLAG_SHARE = 0.1

# Who may decide and whether it is still waiting are not evidence.
NOT_EVIDENCE = ("permission", "four_eyes", "pending")


@dataclass
class Verdict:
    level: str
    headline: str
    samples: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    regressed: list[str] = field(default_factory=list)
    overridden: list[str] = field(default_factory=list)
    inconclusive: list[str] = field(default_factory=list)
    not_measured: list[str] = field(default_factory=list)
    unverified: list[str] = field(default_factory=list)
    red_flags: list[str] = field(default_factory=list)
    inconclusive_signals: int = 0  # the small kinds of task share one line of `inconclusive`


def _pct(value: Any) -> str:
    return "—" if not isinstance(value, int | float) else f"{100 * value:.0f} %"


def evaluation_samples(evaluation: Evaluation | None) -> list[str]:
    """What the evaluation's figures rest on, in counts."""
    if evaluation is None:
        return ["no evaluation"]
    if evaluation.status != WorkStatus.FINISHED:
        return [f"evaluation {evaluation.pk}: {evaluation.done} of {evaluation.total} items so far"]
    summary = evaluation.summary or {}
    cand, live = summary.get("candidate") or {}, summary.get("baseline") or {}
    comparison = summary.get("comparison") or {}
    items = int(summary.get("items") or evaluation.total or 0)
    episodes = (cand.get("episodes") or {}).get("n") or 0
    parts = [f"evaluation {evaluation.pk}: {items} item{'s' if items != 1 else ''}"]
    if episodes:
        live_episodes = (live.get("episodes") or {}).get("n", 0)
        parts.append(
            f"{episodes} whole episodes per version"
            + (f" ({live_episodes} for live)" if live_episodes != episodes else "")
        )
    turns = items - episodes
    if turns > 0:
        parts.append(f"{turns} single turn{'s' if turns != 1 else ''}")
    parts.append(f"{comparison.get('n', 0)} decided (win rate)")
    judged, blank = int(comparison.get("reward_diff_n") or 0), int(comparison.get("reward_diff_blank_n") or 0)
    parts.append(f"{judged - blank} judged pairs" + (f" (and {blank} of two empty answers)" if blank else ""))
    if cand.get("graded_n"):
        parts.append(f"{cand['graded_n']} graded answers")
    gain = summary.get("gain") or {}
    if gain.get("tasks"):
        parts.append(f"{gain['tasks']} distinct tasks x {gain.get('seeds', 1)} seeds")
    return [", ".join(parts)]


def red_flags(evaluation: Evaluation | None) -> list[str]:
    """The candidate's broken answers, with the live version's share beside each."""
    if evaluation is None or evaluation.status != WorkStatus.FINISHED:
        return []
    summary = evaluation.summary or {}
    cand, live = summary.get("candidate") or {}, summary.get("baseline") or {}
    flags = []
    for key, label in (("empty_rate", "Empty answers"), ("truncated_rate", "Cut off at the token limit")):
        rate = cand.get(key)
        if isinstance(rate, int | float) and rate >= RED_FLAG_SHARE:
            flags.append(f"{label} {_pct(rate)} (live {_pct(live.get(key))})")
    if cand.get("errors"):
        flags.append(f"Generation errors: {cand['errors']} of the candidate's items (live {live.get('errors', 0)})")
    if summary.get("judge_failures"):
        flags.append(f"Judge failures: {summary['judge_failures']} items have no judge reward")
    return flags


def _judged(signals: list[Signal]) -> Signal | None:
    return next((s for s in signals if s.code == "reward_diff"), None)


def promotion_verdict(
    *,
    signals: list[Signal],
    evaluation: Evaluation | None,
    checks: list[Precondition] | None = None,
    harm: Precondition | None = None,
    judge_agreement: dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    breaches: list[dict[str, Any]] | None = None,
) -> Verdict:
    """The verdict from what the page has already computed (no query). `checks` are the
    approval's preconditions while the request waits (None once it is decided: then only the
    evidence counts); `harm` the harm precondition when `checks` are not given."""
    verdict = Verdict(level="clear", headline="", samples=evaluation_samples(evaluation))
    evidence = [c for c in checks or [] if c.code not in NOT_EVIDENCE]
    if harm is not None and not any(c.code == harm.code for c in evidence):
        evidence.append(harm)
    verdict.blocked = [f"{c.label}: {c.detail}" for c in evidence if not c.ok]
    # Kinds of task are many and small: their inconclusive ones make one line.
    open_kinds = [s for s in signals if s.code.startswith(KIND_PREFIX) and s.status == SignalStatus.INCONCLUSIVE]
    for signal in signals:
        status = signal.status
        line = f"{signal.label} ({signal.n}): {signal.why}" if signal.n else f"{signal.label}: {signal.why}"
        if status == SignalStatus.REGRESSED:
            verdict.regressed.append(signal.describe() + (f" — {signal.note}" if signal.note else ""))
        elif status == SignalStatus.INCONCLUSIVE and (len(open_kinds) < 2 or signal not in open_kinds):
            verdict.inconclusive.append(line)
        elif status == SignalStatus.NOT_MEASURED:
            verdict.not_measured.append(f"{signal.label}: not measured — {signal.why}")
    verdict.inconclusive_signals = sum(1 for s in signals if s.status == SignalStatus.INCONCLUSIVE)
    if len(open_kinds) >= 2:
        kinds = "; ".join(f"{s.label.removeprefix('Task success · ')} ({s.n})" for s in open_kinds)
        verdict.inconclusive.append(
            f"Task success by kind, {len(open_kinds)} kinds whose intervals span the threshold: {kinds}"
        )
    if harm is not None and harm.ok and harm.detail.startswith("not measured"):
        verdict.not_measured.append(f"{harm.label}: {harm.detail}")
    verdict.overridden = list(overrides or [])
    for breach in breaches or []:
        verdict.red_flags.append(f"Monitor breach: {breach.get('monitor', '')} {breach.get('message', '')}".strip())
    gate = (judge_agreement or {}).get("gate") or {}
    judge_used = bool((getattr(evaluation, "config", None) or {}).get("judge")) or _judged(signals) is not None
    if gate and not gate.get("allowed") and judge_used:
        verdict.unverified.append(
            f"Judge agreement: gate blocked ({gate.get('reason') or 'no agreement measured'}) — "
            "the judge's rewards and the win rate decided by them are unverified"
        )
    verdict.red_flags += red_flags(evaluation)
    verdict.level, verdict.headline = _headline(verdict, evaluation)
    return verdict


def _headline(verdict: Verdict, evaluation: Evaluation | None) -> tuple[str, str]:
    if verdict.blocked:
        return "blocked", f"Approval is refused: {len(verdict.blocked)} precondition{_s(verdict.blocked)} not met"
    if evaluation is None or evaluation.status != WorkStatus.FINISHED:
        return "waiting", "Waiting for the evaluation: approval needs its figures"
    counts = [
        (len(verdict.regressed), "regressed"),
        (len(verdict.overridden), "overridden"),
        (verdict.inconclusive_signals, "inconclusive"),
        (len(verdict.not_measured), "not measured"),
        (len(verdict.unverified), "unverified"),
        (len(verdict.red_flags), "red flag" + ("s" if len(verdict.red_flags) != 1 else "")),
    ]
    open_items = [f"{n} {what}" for n, what in counts if n]
    if open_items:
        return "caution", "The evidence does not settle it: " + ", ".join(open_items)
    return "clear", "Every signal measured and conclusive; none regressed; nothing flagged"


def _s(items: list[Any]) -> str:
    return "" if len(items) == 1 else "s"


def promotion_overrides(promotion) -> list[str]:
    """The requester's written reasons for going ahead despite a check, with their name."""
    who = promotion.requested_by.username if promotion.requested_by_id else "the requester"
    out = []
    if promotion.regression_override_reason:
        out.append(f"Regression overridden by {who}: {promotion.regression_override_reason}")
    if promotion.breach_override_reason:
        out.append(f"Monitor breach overridden by {who}: {promotion.breach_override_reason}")
    if promotion.rebase_reason:
        out.append(f"Rebased onto the live version by {who}: {promotion.rebase_reason}")
    return out
