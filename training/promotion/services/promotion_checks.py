"""The preconditions of a promotion, each named with whether it holds, and the figures a
request records (the producing job's monitors, the judge's agreement)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from feedback.selectors.judge import agreement_as_dict, agreement_by_version, judge_reward_gate
from training.promotion.models import Evaluation, PromotionRequest
from training.promotion.services import harm_precondition
from training.promotion.services.promotion_refused import Precondition, PromotionRefused
from training.promotion.services.promotion_signals import SignalStatus, promotion_signals, regressions
from training.promotion.services.release import release_in_progress
from training.promotion.services.rollouts import rollout_active
from training.serving.models import Deployment, ModelVersion, ModelVersionKind, ModelVersionStatus
from training.serving.selectors import live_withdrawals
from webapp.kernel.work import WorkStatus

REQUEST = "training.add_promotionrequest"


def raise_first_unmet(checks: list[Precondition]) -> None:
    for check in checks:
        if not check.ok:
            raise PromotionRefused(check.detail, field=check.field, code=check.code)


def lineage(version: ModelVersion, *, limit: int = 100) -> list[ModelVersion]:
    """The version and its ancestors, nearest first."""
    chain, seen, current = [], set(), version
    while current is not None and current.pk not in seen and len(chain) < limit:
        chain.append(current)
        seen.add(current.pk)
        current = current.parent
    return chain


def training_job_of(version: ModelVersion):
    """The training job that produced the version, if it was trained here."""
    return getattr(version, "produced_by_job", None)


def monitors_snapshot(version: ModelVersion) -> dict[str, Any]:
    """The producing job's monitor state: breaches, whether it was flagged or stopped."""
    job = training_job_of(version)
    if job is None:
        return {"job": None, "breaches": [], "flagged": False}
    return {
        "job": job.pk,
        "job_status": job.status,
        "flagged": bool(job.flagged),
        "breaches": list(job.breaches or [])[-20:],
        "eval_metrics": job.eval_metrics or {},
    }


def agreement_snapshot(deployment: Deployment) -> dict[str, Any]:
    """The judge's agreement with operators now, per judge version, and the training gate."""
    gate = judge_reward_gate(deployment=deployment)
    return {
        "at": timezone.now().isoformat(),
        "gate": {
            "allowed": gate.allowed,
            "reason": gate.reason,
            "judge_model": gate.judge_model,
            "prompt_version": gate.prompt_version,
            "kappa": gate.kappa,
            "n": gate.n,
        },
        "versions": [agreement_as_dict(row) for row in agreement_by_version(deployment=deployment)],
    }


def snapshot(candidate: ModelVersion, deployment: Deployment, evaluation: Evaluation) -> dict[str, Any]:
    return {
        "signals": [s.as_dict() for s in promotion_signals(candidate=candidate, evaluation=evaluation)],
        "at": timezone.now().isoformat(),
        "monitors": monitors_snapshot(candidate),
        "judge_agreement": agreement_snapshot(deployment),
        "evaluation": {"id": evaluation.pk, "status": evaluation.status, "summary": evaluation.summary},
    }


# Shared preconditions -----------------------------------------------------------------


def check_deployable(candidate: ModelVersion) -> Precondition:
    if candidate.status == ModelVersionStatus.FAILED:
        return Precondition("deployable", "Deployable", False, f"{candidate.name} failed", "candidate")
    if candidate.kind == ModelVersionKind.FULL:
        return Precondition(
            "deployable",
            "Deployable",
            False,
            f"{candidate.name} is a full checkpoint: the shared inference server hot-loads LoRA adapters only. "
            "Register the checkpoint as a base model served by its own server (prepare_model local --path … "
            "--name …; serve_inference --base … --port …) and promote that base version",
            "candidate",
        )
    return Precondition("deployable", "Deployable", True, f"{candidate.get_kind_display()} over {candidate.base_model}")


def check_evaluation_finished(evaluation: Evaluation, candidate: ModelVersion, deployment: Deployment) -> Precondition:
    label = "Evaluation finished"
    if evaluation.candidate_id != candidate.pk or evaluation.deployment_id != deployment.pk:
        return Precondition(
            "evaluation", label, False, f"evaluation {evaluation.pk} is not of {candidate.name} on {deployment.name}"
        )
    if evaluation.status != WorkStatus.FINISHED:
        progress = f", {evaluation.done}/{evaluation.total} items" if evaluation.is_active else ""
        error = f": {evaluation.error[:200]}" if evaluation.error else ""
        return Precondition(
            "evaluation",
            label,
            False,
            f"evaluation {evaluation.pk} is not finished ({evaluation.get_status_display().lower()}{progress}{error})",
            "evaluation",
        )
    return Precondition("evaluation", label, True, f"evaluation {evaluation.pk}: {evaluation.total} items")


def check_evaluation_current(evaluation: Evaluation, live: ModelVersion | None) -> Precondition:
    label = "Compared with the live version"
    if live is not None and evaluation.baseline_id != live.pk:
        return Precondition(
            "baseline",
            label,
            False,
            f"evaluation {evaluation.pk} compared against {evaluation.baseline.name}, but {live.name} is live now: "
            "run a new evaluation",
            "evaluation",
        )
    return Precondition("baseline", label, True, f"against {evaluation.baseline.name}")


def _share_text(share: dict[str, Any]) -> str:
    return f"{share['count']} of {share['n']} episodes ({share['rate']:.0%})"


def harm_findings(summary: dict[str, Any]) -> tuple[list[str], list[str], str]:
    """(why the candidate does more harm than the live version, what was measured, the task
    success of both) from an evaluation's summary: each harm rate of the candidate's episodes
    above the live version's is a finding (writes to records the task does not concern, tool
    calls on ids never shown, policy violations: writes to the task's own records that its
    expected outcome does not contain). No episodes, nothing measured; a rate an older
    evaluation did not record is left out."""
    cand = (summary.get("candidate") or {}).get("episodes")
    base = (summary.get("baseline") or {}).get("episodes")
    if not cand or not base:
        return [], [], ""
    findings, measured = [], []
    for key, label in harm_precondition.HARM_SIGNALS:
        if key not in cand or key not in base:
            continue
        c, b = cand[key], base[key]
        text = f"the candidate {label} in {_share_text(c)}, the live version in {_share_text(b)}"
        measured.append(text)
        if (c["rate"] or 0.0) > (b["rate"] or 0.0):
            findings.append(text)
    success = ""
    if cand["success"]["n"] and base["success"]["n"]:
        success = f"task success {cand['success']['rate']:.0%} vs live {base['success']['rate']:.0%}"
    return findings, measured, success


def check_harm(evaluation: Evaluation | None) -> Precondition:
    """No more harm than the live version: the share of the candidate's evaluation episodes
    that changed records the task does not concern, and the share that called a tool on an id
    never shown, are each at most the live version's — whatever the success rate. No
    override: a candidate that pays the wrong customer is not promoted."""
    label = "No more collateral changes or unknown-id tool calls than live"
    if evaluation is None or evaluation.status != WorkStatus.FINISHED:
        return Precondition("harm", label, True, "measured when the evaluation finishes")
    findings, measured, success = harm_findings(evaluation.summary or {})
    if not measured:
        return Precondition(
            "harm", label, True, "not measured: the evaluation ran no episodes (add an environment to measure it)"
        )
    if findings:
        detail = "blocked whatever the success rate: " + "; ".join(findings)
        return Precondition("harm", label, False, detail + (f" ({success})" if success else ""), "evaluation")
    return Precondition("harm", label, True, "; ".join(measured))


def check_regressions(
    candidate: ModelVersion, evaluation: Evaluation | None, override_reason: str, *, overridden_by: str = ""
) -> Precondition:
    """No signal regresses beyond its threshold (see `promotion_signals`) — or the requester
    gave a reason, recorded with their name. It holds with a warning when signals it counts
    are inconclusive or not measured, and says which: "no regression" is not "no drop"."""
    label = "No signal regresses beyond its threshold"
    signals = promotion_signals(candidate=candidate, evaluation=evaluation)
    worse = regressions(signals)
    undecided = [s for s in signals if s.gates and s.status in (SignalStatus.INCONCLUSIVE, SignalStatus.NOT_MEASURED)]
    caveat = "; ".join(f"{s.label} {s.status}" for s in undecided)
    if not worse:
        if undecided:
            decided = len([s for s in signals if s.gates]) - len(undecided)
            return Precondition(
                "regression",
                label,
                True,
                f"no signal regresses, but {len(undecided)} cannot tell ({caveat}); "
                f"{decided} within {'its' if decided == 1 else 'their'} threshold or better",
                warn=True,
            )
        if not signals:
            return Precondition("regression", label, True, "no signal to compare yet", warn=True)
        return Precondition("regression", label, True, "every signal within its threshold of the live version")
    what = "; ".join(s.describe() for s in worse)
    if override_reason.strip():
        who = f" by {overridden_by}" if overridden_by else ""
        return Precondition(
            "regression",
            label,
            True,
            f"regression overridden{who}: {override_reason.strip()[:300]} ({what})",
            warn=True,
        )
    return Precondition(
        "regression",
        label,
        False,
        f"{what}; give a reason to override",
        "regression_override_reason",
    )


def check_monitors(candidate: ModelVersion, override_reason: str) -> Precondition:
    label = "No monitor breach"
    snap = monitors_snapshot(candidate)
    breaches = snap["breaches"]
    if snap.get("flagged") or breaches or snap.get("job_status") == "stopped":
        what = "; ".join(str(b.get("message", b)) for b in breaches[-3:]) or "the job was flagged"
        if override_reason.strip():
            return Precondition("monitors", label, True, f"breach overridden: {override_reason.strip()[:300]}")
        return Precondition(
            "monitors",
            label,
            False,
            f"training job {snap['job']} breached a monitor ({what}); give a reason to override",
            "breach_override_reason",
        )
    detail = f"training job {snap['job']}: no breach" if snap["job"] else "not trained here: no monitors"
    return Precondition("monitors", label, True, detail)


def check_lineage(candidate: ModelVersion, live: ModelVersion | None, rebase_reason: str) -> Precondition:
    label = "Built from the live version"
    if live is None:
        return Precondition("lineage", label, True, "no live version yet")
    if any(v.pk == live.pk for v in lineage(candidate)):
        return Precondition("lineage", label, True, f"{live.name} is an ancestor")
    if rebase_reason.strip():
        return Precondition("lineage", label, True, f"rebased explicitly: {rebase_reason.strip()[:300]}")
    return Precondition(
        "lineage",
        label,
        False,
        f"{candidate.name} was not built from the live version {live.name} (its lineage: "
        f"{' ← '.join(v.name for v in lineage(candidate)[:6])}); rebase explicitly with a reason",
        "rebase_reason",
    )


def check_not_live(candidate: ModelVersion, live: ModelVersion | None) -> Precondition:
    ok = live is None or live.pk != candidate.pk
    return Precondition(
        "not_live", "Not live already", ok, "" if ok else f"{candidate.name} is already live", "candidate"
    )


def check_not_withdrawn_since(promotion: PromotionRequest) -> Precondition:
    """A request made before its candidate was rolled back from cannot put it back: the
    rollback is news its requester did not have. A new request (made since) can."""
    label = "Not withdrawn since the request"
    withdrawal = live_withdrawals(deployment_id=promotion.deployment_id).get(promotion.candidate_id)
    if withdrawal is None or withdrawal.at < promotion.requested_at:
        return Precondition("withdrawn", label, True, "")
    return Precondition(
        "withdrawn",
        label,
        False,
        f"{withdrawal.describe()} for {promotion.deployment.name}, after this request was made: "
        "withdraw it and ask again with a new request",
        "candidate",
    )


def check_no_release_running(deployment: Deployment) -> Precondition:
    running = release_in_progress(deployment=deployment)
    if running is not None:
        return Precondition(
            "release",
            "No release in progress",
            False,
            f"release {running.pk} of {running.version.name} to {deployment.name} is in progress",
        )
    return check_no_rollout_running(deployment)


def check_no_rollout_running(deployment: Deployment) -> Precondition:
    """A progressive release under way owns the deployment's traffic until it ends."""
    rollout = rollout_active(deployment_id=deployment.pk)
    if rollout is not None:
        return Precondition(
            "release",
            "No release in progress",
            False,
            f"the progressive release {rollout.pk} of {rollout.candidate.name} to {deployment.name} is "
            f"{rollout.get_state_display().lower()}: let it complete, or roll it back on /rollouts/{rollout.pk}/ "
            f"(POST /api/v1/rollouts/{rollout.pk}/rollback) first",
        )
    return Precondition("release", "No release in progress", True, "")
