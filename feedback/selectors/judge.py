"""Reads for the judge: which endpoint a deployment uses, its results per turn, and how
far each judge version agrees with operators' own ratings (and so whether training may
use its rewards)."""

from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Avg, Count, Q

from feedback.judge.agreement import (
    Estimate,
    kappa_estimate,
    percent_agreement,
    reward_to_ordinal,
    spearman_estimate,
)
from feedback.judge.client import JudgeEndpoint, JudgeNotConfigured
from feedback.judge.prompts import CURRENT_TURN
from feedback.judge.quality import text_is_garbled
from feedback.models import (
    DeploymentJudge,
    JudgeResult,
    JudgeStatus,
    Message,
    OrderSwapCheck,
    RatingKind,
    TurnRating,
    rating_normalised,
)
from feedback.models.judge import judge_key_env_check
from feedback.selectors.traces import message_as_openai
from training.serving.models import Deployment


def judge_endpoint_for(*, deployment: Deployment | None = None) -> JudgeEndpoint:
    """The deployment's own judge endpoint when it has one, else the settings' one.
    Raises `JudgeNotConfigured` when neither is set."""
    override = DeploymentJudge.objects.filter(deployment=deployment).first() if deployment is not None else None
    if override is None:
        return JudgeEndpoint.from_settings()
    try:
        # Checked again at use: a row written past the model's validation (a migration, raw
        # SQL, an older version) must not make us read and send any variable it names.
        judge_key_env_check(override.api_key_env)
    except ValidationError as exc:
        raise JudgeNotConfigured(
            f"deployment {deployment.name}: judge key variable refused: {'; '.join(exc.messages)}"
        ) from None
    return JudgeEndpoint.from_settings(
        base_url=override.base_url,
        model=override.model,
        api_key=os.environ.get(override.api_key_env, "") if override.api_key_env else "",
        schema_mode=override.schema_mode,
        correction_mode=override.correction_mode,
    )


def judge_is_configured(*, deployment: Deployment | None = None) -> bool:
    try:
        judge_endpoint_for(deployment=deployment)
    except JudgeNotConfigured:
        return False
    return True


def judge_results_for_messages(*, message_ids: list[int]) -> dict[int, list[JudgeResult]]:
    """Each message's judgements, newest first, each with its `doubts` (judge_result_doubts);
    the latest also with `unverified` (judgements_mark_unverified)."""
    from feedback.selectors.judge_gate import judgements_mark_unverified  # noqa: PLC0415 — it imports this module

    out: dict[int, list[JudgeResult]] = {}
    results = list(JudgeResult.objects.filter(message_id__in=message_ids).order_by("-created_at", "-id"))
    judgements_mark_unverified(r for r in results if r.is_latest)
    for r in results:
        r.doubts = judge_result_doubts(r)
        out.setdefault(r.message_id, []).append(r)
    return out


def judge_latest_for_message(*, message_id: int) -> JudgeResult | None:
    """The judgement training uses for a turn: the latest that succeeded."""
    return JudgeResult.objects.filter(message_id=message_id, is_latest=True).first()


@dataclass(frozen=True, slots=True)
class JudgedTurn:
    """A judged assistant turn as training reads it: the context it answered (OpenAI chat
    messages), the logged turn, the trace's tools, and the latest judgement of it."""

    result_id: int
    trace_id: int
    message_id: int
    context: list[dict[str, Any]]
    logged: dict[str, Any]
    tools: list[dict[str, Any]]
    rubric: dict[str, Any]
    reward: float
    rationale: str
    corrected_response: str | None  # written by the judge; operators' are `Correction`s
    judge_model: str
    prompt_version: str


def judged_turns(
    *,
    deployment: Deployment | None = None,
    judge_model: str | None = None,
    prompt_version: str | None = None,
    limit: int = 10_000,
) -> list[JudgedTurn]:
    """The latest successful judgement of each judged turn, newest first, with its context,
    in two queries whatever the number of turns. Check `judge_reward_gate` before using
    the rewards without a person's say-so."""
    qs = JudgeResult.objects.filter(is_latest=True, status=JudgeStatus.SUCCEEDED).select_related("message", "trace")
    if deployment is not None:
        qs = qs.filter(trace__deployment=deployment)
    if judge_model is not None:
        qs = qs.filter(judge_model=judge_model)
    if prompt_version is not None:
        qs = qs.filter(prompt_version=prompt_version)
    results = list(qs.order_by("-created_at", "-id")[:limit])
    needed: dict[int, int] = {}
    for r in results:
        needed[r.trace_id] = max(needed.get(r.trace_id, -1), r.message.position)
    by_trace: dict[int, list[Message]] = defaultdict(list)
    for m in Message.objects.filter(trace_id__in=list(needed)).order_by("trace_id", "position"):
        if m.position <= needed[m.trace_id]:
            by_trace[m.trace_id].append(m)
    out = []
    for r in results:
        earlier = [message_as_openai(m) for m in by_trace[r.trace_id] if m.position < r.message.position]
        out.append(
            JudgedTurn(
                result_id=r.pk,
                trace_id=r.trace_id,
                message_id=r.message_id,
                context=earlier,
                logged=message_as_openai(r.message),
                tools=r.trace.tools or [],
                rubric=r.rubric or {},
                reward=r.reward if r.reward is not None else 0.0,
                rationale=r.rationale,
                corrected_response=r.corrected_response or None,
                judge_model=r.judge_model,
                prompt_version=r.prompt_version,
            )
        )
    return out


# Agreement ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GateDecision:
    """Whether training may use this judge version's rewards without a person's say-so."""

    allowed: bool
    reason: str
    judge_model: str
    prompt_version: str
    kappa: float | None
    n: int
    min_kappa: float
    min_n: int


@dataclass(slots=True)
class SwapSummary:
    prompt_version: str
    n: int
    pair_agreement: float | None
    mean_abs_diff: float | None
    failed: int = 0


@dataclass(slots=True)
class VersionAgreement:
    judge_model: str
    prompt_version: str
    succeeded: int
    failed: int
    pass_fail: Estimate  # Cohen's kappa, judge pass/fail vs operators' thumbs/scores
    percent_agreement: float | None
    confusion: dict[str, int]  # "judge/human": count, e.g. "pass/fail"
    scores: Estimate  # Spearman, judge reward vs operators' 1-5 scores
    weighted_kappa: Estimate  # quadratic weights, reward on 1-5 vs rounded mean score
    gate: GateDecision
    swap: list[SwapSummary] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.judge_model} · {self.prompt_version}"


@dataclass(slots=True)
class HumanLabel:
    passed: bool | None  # None when the ratings average to neutral
    score: float | None  # mean 1-5 score, when any score was given


def human_labels(*, deployment: Deployment | None = None) -> dict[int, HumanLabel]:
    """Per rated assistant turn: pass/fail from the mean normalised rating (thumbs up 1,
    down 0; score s as (s-1)/4; exactly 0.5 is neutral), and the mean 1-5 score."""
    qs = TurnRating.objects.all()
    if deployment is not None:
        qs = qs.filter(trace__deployment=deployment)
    norms: dict[int, list[float]] = defaultdict(list)
    scores: dict[int, list[int]] = defaultdict(list)
    for message_id, kind, value in qs.values_list("message_id", "kind", "value"):
        norms[message_id].append(rating_normalised(kind, value))
        if kind == RatingKind.SCORE:
            scores[message_id].append(value)
    out = {}
    for message_id, values in norms.items():
        mean = sum(values) / len(values)
        passed = None if abs(mean - 0.5) < 1e-9 else mean > 0.5
        s = scores.get(message_id)
        out[message_id] = HumanLabel(passed=passed, score=sum(s) / len(s) if s else None)
    return out


def _gate(judge_model: str, prompt_version: str, kappa: Estimate) -> GateDecision:
    min_kappa, min_n = settings.JUDGE_REWARD_MIN_KAPPA, settings.JUDGE_REWARD_MIN_N
    if kappa.n < min_n:
        allowed, reason = False, f"only {kappa.n} rated turns judged by this version; {min_n} needed"
    elif kappa.value is None:
        allowed, reason = False, "kappa undefined: judge and operators each used a single label"
    elif kappa.value < min_kappa:
        allowed, reason = False, f"kappa {kappa.value:.2f} is below the minimum {min_kappa:.2f}"
    else:
        allowed, reason = True, f"kappa {kappa.value:.2f} >= {min_kappa:.2f} over {kappa.n} turns"
    return GateDecision(allowed, reason, judge_model, prompt_version, kappa.value, kappa.n, min_kappa, min_n)


def _swap_summaries(deployment: Deployment | None) -> dict[str, list[SwapSummary]]:
    qs = OrderSwapCheck.objects.all()
    if deployment is not None:
        qs = qs.filter(result__trace__deployment=deployment)
    rows = qs.values("judge_model", "prompt_version").annotate(
        n=Count("id", filter=Q(status=JudgeStatus.SUCCEEDED)),
        failed=Count("id", filter=Q(status=JudgeStatus.FAILED)),
        agreement=Avg("pair_agreement", filter=Q(status=JudgeStatus.SUCCEEDED)),
        diff=Avg("mean_abs_diff", filter=Q(status=JudgeStatus.SUCCEEDED)),
    )
    out: dict[str, list[SwapSummary]] = defaultdict(list)
    for r in rows.order_by("judge_model", "prompt_version"):
        out[r["judge_model"]].append(SwapSummary(r["prompt_version"], r["n"], r["agreement"], r["diff"], r["failed"]))
    return out


def agreement_by_version(*, deployment: Deployment | None = None) -> list[VersionAgreement]:
    """For every judge version (model and prompt version) that has judged anything: its
    agreement with operators' ratings of the same turns, newest judgement per turn."""
    results = JudgeResult.objects.all()
    if deployment is not None:
        results = results.filter(trace__deployment=deployment)
    counts = {
        (r["judge_model"], r["prompt_version"]): r
        for r in results.exclude(judge_model="")
        .values("judge_model", "prompt_version")
        .annotate(
            succeeded=Count("id", filter=Q(status=JudgeStatus.SUCCEEDED)),
            failed=Count("id", filter=Q(status=JudgeStatus.FAILED)),
        )
    }
    labels = human_labels(deployment=deployment)
    latest: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    for model, version, message_id, reward in (
        results.filter(status=JudgeStatus.SUCCEEDED, message_id__in=list(labels))
        .order_by("created_at", "id")
        .values_list("judge_model", "prompt_version", "message_id", "reward")
    ):
        latest[(model, version)][message_id] = reward  # later rows overwrite earlier ones
    swaps = _swap_summaries(deployment)
    threshold = settings.JUDGE_PASS_THRESHOLD
    out = []
    for key in sorted(counts, key=lambda k: (k[0], k[1])):
        rewards = latest.get(key, {})
        judge_pf, human_pf = [], []
        judge_s, human_s = [], []
        for message_id, reward in rewards.items():
            label = labels[message_id]
            if label.passed is not None:
                judge_pf.append("pass" if reward >= threshold else "fail")
                human_pf.append("pass" if label.passed else "fail")
            if label.score is not None:
                judge_s.append(reward)
                human_s.append(label.score)
        kappa = kappa_estimate(judge_pf, human_pf, categories=["fail", "pass"])
        confusion: dict[str, int] = defaultdict(int)
        for j, h in zip(judge_pf, human_pf, strict=True):
            confusion[f"{j}/{h}"] += 1
        weighted = kappa_estimate(
            [reward_to_ordinal(r) for r in judge_s],
            [int(s + 0.5) for s in human_s],
            weights="quadratic",
            categories=[1, 2, 3, 4, 5],
        )
        out.append(
            VersionAgreement(
                judge_model=key[0],
                prompt_version=key[1],
                succeeded=counts[key]["succeeded"],
                failed=counts[key]["failed"],
                pass_fail=kappa,
                percent_agreement=percent_agreement(judge_pf, human_pf),
                confusion=dict(confusion),
                scores=spearman_estimate(judge_s, human_s),
                weighted_kappa=weighted,
                gate=_gate(key[0], key[1], kappa),
                swap=swaps.get(key[0], []),
            )
        )
    return out


def judge_reward_gate(
    *, deployment: Deployment | None = None, judge_model: str | None = None, prompt_version: str | None = None
) -> GateDecision:
    """May training use rewards of this judge version automatically? By default the
    version new judgements are made with (the deployment's endpoint model, the current
    prompt). Allowed when Cohen's kappa against operators' ratings reaches
    `JUDGE_REWARD_MIN_KAPPA` over at least `JUDGE_REWARD_MIN_N` rated turns."""
    if judge_model is None:
        try:
            judge_model = judge_endpoint_for(deployment=deployment).model
        except JudgeNotConfigured:
            return GateDecision(
                False,
                "no judge endpoint is configured",
                "",
                prompt_version or CURRENT_TURN.version,
                None,
                0,
                settings.JUDGE_REWARD_MIN_KAPPA,
                settings.JUDGE_REWARD_MIN_N,
            )
    prompt_version = prompt_version or CURRENT_TURN.version
    for row in agreement_by_version(deployment=deployment):
        if row.judge_model == judge_model and row.prompt_version == prompt_version:
            return row.gate
    return _gate(judge_model, prompt_version, Estimate(None, 0))


def agreement_as_dict(row: VersionAgreement) -> dict[str, Any]:
    def est(e: Estimate) -> dict[str, Any]:
        return {"value": e.value, "n": e.n, "ci_low": e.low, "ci_high": e.high}

    return {
        "judge_model": row.judge_model,
        "prompt_version": row.prompt_version,
        "judgements": {"succeeded": row.succeeded, "failed": row.failed},
        "pass_fail_kappa": {**est(row.pass_fail), "percent_agreement": row.percent_agreement, "ci": "bootstrap 95%"},
        "confusion": row.confusion,
        "score_spearman": {**est(row.scores), "ci": "Fisher z 95%"},
        "score_weighted_kappa": {**est(row.weighted_kappa), "weights": "quadratic", "ci": "bootstrap 95%"},
        "order_swap": [
            {
                "prompt_version": s.prompt_version,
                "n": s.n,
                "failed": s.failed,
                "pair_agreement": s.pair_agreement,
                "mean_abs_diff": s.mean_abs_diff,
            }
            for s in row.swap
        ],
        "training_gate": {"allowed": row.gate.allowed, "reason": row.gate.reason},
    }


def judge_result_doubts(result: JudgeResult) -> list[str]:
    """Why a judgement that passed the schema still should not be read as a plain success:
    the judge's earlier answers were rejected, its output was cut off, or its rationale or
    rubric is garbled (a corrected response may be a tool call, so it is not read this way). Empty when nothing is in doubt (and for judgements that did not succeed)."""
    if result.status != JudgeStatus.SUCCEEDED:
        return []
    doubts = []
    attempts = result.call_attempts or []
    rejected = [a for a in attempts if a.get("error")]
    if rejected:
        first = str(rejected[0].get("error", ""))[:120]
        doubts.append(f"the judge's first {len(rejected)} answer(s) were rejected ({first})")
    if attempts and attempts[-1].get("finish_reason") == "length":
        doubts.append("the accepted answer was cut off at the token limit")
    if text_is_garbled(result.rationale or ""):
        doubts.append("the rationale is garbled")
    criteria = (result.rubric or {}).get("criteria") or []
    garbled = sum(1 for c in criteria if text_is_garbled(str(c.get("criterion", "")) if isinstance(c, dict) else ""))
    if garbled:
        doubts.append(f"{garbled} of {len(criteria)} rubric criteria are garbled")
    return doubts
