"""The training gate: may a training job use this judge's scores, or a training set the
judge's rubrics and corrections, without a person overriding it?

It is decided on the prompt training actually uses (`score-candidates/…`, scored on the
operators' rated turns with their feedback left out: `feedback.services.judge_gate`), and
on evidence rather than a point estimate:

- Cohen's kappa between the judge's pass/fail (score >= PRACTICUM_JUDGE_PASS_THRESHOLD) and
  the operators' verdicts, over at least PRACTICUM_JUDGE_REWARD_MIN_N rated turns, with the
  **lower bound** of its 95% bootstrap interval at least PRACTICUM_JUDGE_REWARD_MIN_KAPPA;
- order-swap consistency (the same candidates scored in both orders) over at least
  PRACTICUM_JUDGE_GATE_MIN_SWAP_N checks, at least PRACTICUM_JUDGE_GATE_MIN_SWAP_AGREEMENT;
- the judge's failure rate on these calls at most PRACTICUM_JUDGE_GATE_MAX_FAILURE_RATE.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Avg, Count, Q

from feedback.judge.agreement import kappa_estimate
from feedback.judge.client import JudgeNotConfigured
from feedback.judge.prompts import ACTION_PROMPT_PREFIX, CURRENT_SCORE
from feedback.models import CandidateScoring, JudgeResult, JudgeStatus, OrderSwapCheck, ScoringPurpose, Trace
from feedback.selectors.judge import human_labels, judge_endpoint_for
from feedback.selectors.judge_actions import action_agreement
from training.serving.models import Deployment


@dataclass(frozen=True, slots=True)
class TrainingGate:
    allowed: bool
    reason: str  # every unmet condition, or what was met
    judge_model: str
    prompt_version: str
    kappa: float | None
    kappa_low: float | None
    n: int
    swap_n: int
    swap_agreement: float | None
    calls: int
    failure_rate: float | None
    thresholds: dict[str, float] = field(default_factory=dict)
    # A judge in "actions" mode: per kind, its chosen actions against operators' corrections.
    action_agreement: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _thresholds() -> dict[str, float]:
    return {
        "min_kappa_low": settings.JUDGE_REWARD_MIN_KAPPA,
        "min_n": settings.JUDGE_REWARD_MIN_N,
        "min_swap_n": settings.JUDGE_GATE_MIN_SWAP_N,
        "min_swap_agreement": settings.JUDGE_GATE_MIN_SWAP_AGREEMENT,
        "max_failure_rate": settings.JUDGE_GATE_MAX_FAILURE_RATE,
        "min_action_agreement": settings.JUDGE_ACTION_MIN_AGREEMENT,
        "min_action_n": settings.JUDGE_ACTION_MIN_N,
    }


def judge_training_gate(
    *,
    deployment: Deployment | None,
    judge_model: str | None = None,
    judge_base_url: str | None = None,
    correction_mode: str = "text",
) -> TrainingGate:
    """The gate for `deployment`'s judge (its own endpoint, else the settings' one). The
    evidence counted is that of this judge: its model name at its URL. Another server that
    answers to the same name (an endpoint edited to point elsewhere) starts uncalibrated.
    A judge that chooses actions (`correction_mode` "actions") must also agree with the
    operators' own corrections on every kind (`judge_actions.action_agreement`). Resolved
    from the deployment, the gate asks this of a judge in "actions" mode now, and of one
    that has chosen actions before: a switch back to written corrections leaves the chosen
    ones in the data training reads."""
    version = CURRENT_SCORE.version
    t = _thresholds()
    if judge_model is None:
        try:
            endpoint = judge_endpoint_for(deployment=deployment)
        except JudgeNotConfigured:
            return TrainingGate(
                False, "no judge endpoint is configured", "", version, None, None, 0, 0, None, 0, None, t
            )
        judge_model, judge_base_url = endpoint.model, endpoint.base_url
        correction_mode = endpoint.correction_mode
        if correction_mode != "actions" and _has_chosen_actions(deployment, judge_model, judge_base_url):
            correction_mode = "actions"
    calls = CandidateScoring.objects.filter(
        purpose=ScoringPurpose.CALIBRATION, judge_model=judge_model, prompt_version=version
    )
    swaps = OrderSwapCheck.objects.filter(judge_model=judge_model, prompt_version=version)
    if judge_base_url is not None:
        calls = calls.filter(judge_base_url=judge_base_url)
        swaps = swaps.filter(judge_base_url=judge_base_url)
    if deployment is not None:
        calls = calls.filter(deployment=deployment)
        swaps = swaps.filter(result__trace__deployment=deployment)
    labels = human_labels(deployment=deployment)
    latest: dict[int, float] = {}
    for message_id, scores in (
        calls.filter(status=JudgeStatus.SUCCEEDED, message_id__in=list(labels))
        .order_by("created_at", "id")
        .values_list("message_id", "scores")
    ):
        if scores:
            latest[message_id] = float(scores[0])  # later rows overwrite earlier ones
    threshold = settings.JUDGE_PASS_THRESHOLD
    judge_pf, human_pf = [], []
    for message_id, score in latest.items():
        passed = labels[message_id].passed
        if passed is not None:
            judge_pf.append("pass" if score >= threshold else "fail")
            human_pf.append("pass" if passed else "fail")
    kappa = kappa_estimate(judge_pf, human_pf, categories=["fail", "pass"])
    swap = swaps.aggregate(
        n=Count("id", filter=Q(status=JudgeStatus.SUCCEEDED)),
        failed=Count("id", filter=Q(status=JudgeStatus.FAILED)),
        agreement=Avg("pair_agreement", filter=Q(status=JudgeStatus.SUCCEEDED)),
    )
    counted = calls.aggregate(total=Count("id"), failed=Count("id", filter=Q(status=JudgeStatus.FAILED)))
    total = counted["total"] + swap["n"] + swap["failed"]
    failures = counted["failed"] + swap["failed"]
    failure_rate = failures / total if total else None

    unmet = []
    if kappa.n < t["min_n"]:
        unmet.append(f"only {kappa.n} rated turns scored with {version}; {t['min_n']:g} needed")
    elif kappa.value is None or kappa.low is None:
        unmet.append("kappa undefined: the judge or the operators used a single label")
    elif kappa.low < t["min_kappa_low"]:
        unmet.append(
            f"kappa {kappa.value:.2f}, but its 95% lower bound {kappa.low:.2f} is below {t['min_kappa_low']:.2f}"
        )
    if swap["n"] < t["min_swap_n"]:
        unmet.append(f"only {swap['n']} order-swap checks; {t['min_swap_n']:g} needed")
    elif swap["agreement"] is None or swap["agreement"] < t["min_swap_agreement"]:
        unmet.append(f"order-swap consistency {swap['agreement'] or 0:.2f} is below {t['min_swap_agreement']:.2f}")
    if failure_rate is not None and failure_rate > t["max_failure_rate"]:
        unmet.append(
            f"the judge failed {failures} of {total} calls ({failure_rate:.0%}), over {t['max_failure_rate']:.0%}"
        )
    kinds: dict[str, dict[str, Any]] = {}
    if correction_mode == "actions":
        kinds, action_unmet = _action_conditions(deployment, judge_model, judge_base_url, t)
        unmet += action_unmet
    if unmet:
        reason = "; ".join(unmet)
    else:
        reason = (
            f"kappa {kappa.value:.2f} (95% lower bound {kappa.low:.2f}) over {kappa.n} rated turns, "
            f"order-swap consistency {swap['agreement']:.2f} over {swap['n']} checks, "
            f"{failure_rate or 0:.0%} of calls failed"
        )
        if kinds:
            reason += "; chosen actions agree with operators' corrections: " + ", ".join(
                f"{k} {v['rate']:.0%} of {v['n']}" for k, v in kinds.items()
            )
    return TrainingGate(
        allowed=not unmet,
        reason=reason,
        judge_model=judge_model,
        prompt_version=version,
        kappa=kappa.value,
        kappa_low=kappa.low,
        n=kappa.n,
        swap_n=swap["n"],
        swap_agreement=swap["agreement"],
        calls=total,
        failure_rate=failure_rate,
        thresholds=t,
        action_agreement=kinds,
    )


def judgement_correction_mode(result: JudgeResult) -> str:
    """The mode a judgement was made in, from its own prompt, whatever its deployment's
    judge is set to now."""
    return "actions" if result.prompt_version.startswith(ACTION_PROMPT_PREFIX) else "text"


def _has_chosen_actions(deployment: Deployment | None, judge_model: str, judge_base_url: str | None) -> bool:
    made = JudgeResult.objects.filter(
        status=JudgeStatus.SUCCEEDED, judge_model=judge_model, prompt_version__startswith=ACTION_PROMPT_PREFIX
    )
    if judge_base_url is not None:
        made = made.filter(judge_base_url=judge_base_url)
    if deployment is not None:
        made = made.filter(trace__deployment=deployment)
    return made.exists()


def _action_conditions(
    deployment: Deployment | None, judge_model: str, judge_base_url: str | None, t: dict[str, float]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Per kind agreement of the judge's chosen actions with operators' corrections, and
    the conditions it leaves unmet: every kind measured on at least `min_action_n` turns,
    each agreeing at least `min_action_agreement`."""
    kinds = action_agreement(deployment=deployment, judge_model=judge_model, judge_base_url=judge_base_url)
    unmet = []
    if not kinds:
        unmet.append("no operator corrections to measure the judge's chosen actions against")
    for kind, a in kinds.items():
        if a.n < t["min_action_n"]:
            unmet.append(f"chosen actions of kind {kind}: only {a.n} corrected turns; {t['min_action_n']:g} needed")
        elif (a.rate or 0) < t["min_action_agreement"]:
            unmet.append(
                f"chosen actions of kind {kind} agree with operators on {a.rate:.0%} of {a.n}, "
                f"below {t['min_action_agreement']:.0%}"
            )
    return {k: a.as_dict() for k, a in kinds.items()}, unmet


def judgements_mark_unverified(results: Iterable[JudgeResult]) -> None:
    """Set `unverified` on each succeeded judgement: why its judge (its model at its URL,
    for its trace's deployment) has not passed the agreement gate, or "" when it has. A
    listed judgement from an unverified judge is shown as such: its rubric and reward are
    a model's opinion no one has checked against people's. A judgement that chose an action
    is held to the action agreement too, by its own prompt rather than the deployment's
    mode now. One gate per distinct judge and mode."""
    results = list(results)
    todo = [r for r in results if r.status == JudgeStatus.SUCCEEDED]
    for r in results:
        r.unverified = ""
    if not todo:
        return
    deployment_of = dict(Trace.objects.filter(pk__in={r.trace_id for r in todo}).values_list("pk", "deployment_id"))
    deployments = Deployment.objects.in_bulk(set(deployment_of.values()) - {None})
    gates: dict[tuple, TrainingGate] = {}
    for r in todo:
        deployment_id = deployment_of.get(r.trace_id)
        mode = judgement_correction_mode(r)
        key = (deployment_id, r.judge_model, r.judge_base_url, mode)
        if key not in gates:
            gates[key] = judge_training_gate(
                deployment=deployments.get(deployment_id),
                judge_model=r.judge_model,
                judge_base_url=r.judge_base_url,
                correction_mode=mode,
            )
        gate = gates[key]
        r.unverified = "" if gate.allowed else f"the judge's agreement gate has not passed: {gate.reason}"
