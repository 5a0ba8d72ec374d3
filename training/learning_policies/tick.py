"""The periodic tick that runs learning policies (creating and editing them: `services`).

The tick (`learning_policies_tick`, a Celery beat task) never waits for work to finish: each
call moves every policy one step at most and returns.

    no active run ──(trigger holds)──► fire: set from new feedback, job queued   [training]
    job finished ──► evaluation of the candidate vs the live version queued       [evaluating]
    evaluation finished ──► requirements checked ──► promotion request opened     [done]
                                                 └─► checks failed, reasons kept  [done]

A policy never puts a version live: the request waits for another person's approval, as one
a person opened would (`training.promotion.services.promotion`).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from feedback.selectors.judge_gate import judge_training_gate
from training.learning_policies.models import (
    LearningPolicy,
    LearningPolicyRun,
    LearningPolicyUse,
    PolicySignal,
    RunOutcome,
    RunStage,
    UseKind,
)
from training.learning_policies.new_feedback import _items_for, new_signal
from training.learning_policies.services import RUNS_NEED, PolicyError
from training.models import TrainingJob
from training.promotion.models import Evaluation
from training.promotion.services.evaluation import evaluation_create
from training.promotion.services.promotion import promotion_request_create
from training.promotion.services.promotion_checks import (
    Precondition,
    PromotionRefused,
    check_deployable,
    check_evaluation_current,
    check_harm,
    check_lineage,
    check_monitors,
    check_not_live,
    check_regressions,
)
from training.services.jobs import training_job_create
from training.services.judge_gate import judge_gate_pass
from training.services.training_sets import training_set_create
from training.serving.selectors import live_version_get
from webapp.kernel.errors import DomainError
from webapp.kernel.work import WorkStatus

logger = logging.getLogger(__name__)


def learning_policies_tick(*, now: datetime | None = None) -> list[tuple[int, str]]:
    """Move every enabled policy one step: fire, start the evaluation, check the
    requirements, or wait; a disabled policy's run in progress ends without a request.
    Returns (policy id, what happened).

    Each policy is handled under its row's lock, taken with SKIP LOCKED: a second tick
    running at the same time passes over a policy the first holds; the unique active-run
    constraint backs this up."""
    now = now or timezone.now()
    active = LearningPolicyRun.objects.filter(finished_at__isnull=True).values("policy_id")
    ids = list(LearningPolicy.objects.filter(Q(enabled=True) | Q(pk__in=active)).values_list("pk", flat=True))
    done = []
    for pk in ids:
        try:
            done.append((pk, _policy_tick(pk, now)))
        except Exception as exc:
            # One broken policy must not stop the others; its run says what went wrong.
            logger.exception("learning policy %s: tick failed", pk)
            done.append((pk, _fail_active_run(pk, f"{type(exc).__name__}: {exc}", now)))
    return done


@transaction.atomic
def _policy_tick(pk: int, now: datetime) -> str:
    policy = (
        LearningPolicy.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("deployment", "created_by")
        .filter(pk=pk)
        .first()
    )
    if policy is None:
        return "held by another tick"
    run = policy.runs.filter(finished_at__isnull=True).first()
    if run is not None and not policy.enabled:
        # Disabling stops the loop: no evaluation is started and no request opened for it.
        return _end(run, RunOutcome.ERROR, now, error="the policy was disabled while this run was in progress")
    if run is not None:
        return _advance(policy, run, now)
    if not policy.enabled:
        return "disabled"
    why_not, why = _decide(policy, now)
    if why_not:
        if why_not != policy.waiting_reason or policy.checked_at is None:
            policy.waiting_reason = why_not[:500]
        policy.checked_at = now
        policy.save(update_fields=["waiting_reason", "checked_at"])
        return f"waiting: {why_not}"
    return _fire(policy, why, now)


def _decide(policy: LearningPolicy, now: datetime) -> tuple[str, str]:
    """("", why it fires) or (why it waits, "")."""
    who = policy.created_by
    missing = [p for p in RUNS_NEED if not (who.is_active and who.has_perm(p))]
    if missing:
        # The policy acts for this person: it does no more than they may do themselves.
        return f"{who.username} answers for it and may no longer do this ({', '.join(missing)})", ""
    last = policy.runs.order_by("-fired_at", "-id").first()
    if policy.min_interval_minutes and last is not None:
        due = last.fired_at + timedelta(minutes=policy.min_interval_minutes)
        if now < due:
            return f"the last run was at {last.fired_at:%Y-%m-%d %H:%M}; the next may fire from {due:%H:%M}", ""
    if policy.signal == PolicySignal.JUDGE:
        gate = judge_training_gate(deployment=policy.deployment)
        if not gate.allowed:
            return f"the judge's training gate is closed: {gate.reason}", ""
    signal = new_signal(policy=policy)
    needed = max(policy.min_new_turns, 1)
    if signal.turns < needed:
        return f"{signal.turns} of {needed} {signal.what} since the last run", ""
    if (
        last is not None
        and last.outcome == RunOutcome.ERROR
        and last.training_set_id is None
        and (signal.newest is None or signal.newest <= last.fired_at)
        and policy.updated_at <= last.fired_at
    ):
        # The same input would fail the same way: wait for something to change.
        return f"the last run failed ({last.error[:200]}); waiting for new feedback or a change to the policy", ""
    since = f"since run {last.pk}" if last is not None else "so far"
    interval = f", {policy.min_interval_minutes} min since the last run" if policy.min_interval_minutes and last else ""
    return "", f"{signal.turns} new {signal.what} {since} (needs {needed}){interval}"


def _fire(policy: LearningPolicy, why: str, now: datetime) -> str:
    try:
        with transaction.atomic():
            run = LearningPolicyRun.objects.create(policy=policy, fired_at=now, reason=why[:500])
    except IntegrityError:
        return "already running"
    policy.waiting_reason, policy.checked_at = "", now
    policy.save(update_fields=["waiting_reason", "checked_at"])
    try:
        with transaction.atomic():
            items, kind, used = _items_for(policy)
            if not items:
                raise PolicyError([("signal", f"none of the new {kind} feedback is on a turn that can be replayed")])
            selection: dict[str, Any] = {"kind": "learning_policy", "policy": policy.pk, "run": run.pk}
            selection["signal"] = policy.signal
            gate = _judge_gate(policy, items)
            if gate is not None:
                selection["judge_gate"] = gate
            training_set = training_set_create(
                name=slugify(f"{policy.deployment.name}-{policy.name}")[:100],
                items=items,
                deployment=policy.deployment,
                selection=selection,
                description=f"learning policy {policy.name}, run {run.pk}: {why}",
                heldout_fraction=policy.heldout_fraction,
                user=policy.created_by,
            )
            if not training_set.heldout_count and policy.eval_training_set_id is None and not policy.eval_environment:
                # Training first would spend the job and the feedback on a candidate nothing evaluates.
                raise PolicyError(
                    [("heldout_fraction", f"the {len(items)} new turns leave no held-out item to evaluate on")]
                )
            LearningPolicyUse.objects.bulk_create(
                LearningPolicyUse(policy=policy, run=run, kind=kind, object_id=i) for i in sorted(used)
            )
            base = live_version_get(deployment_id=policy.deployment_id)
            if base is None:
                raise PolicyError([("deployment", f"{policy.deployment.name} has no live version to train from")])
            job = training_job_create(
                kind=policy.job_kind,
                config=dict(policy.job_config or {}),
                base_version=base,
                training_set=training_set,
                user=policy.created_by,
                deployment=policy.deployment,
            )
    except DomainError as exc:
        return _end(run, RunOutcome.ERROR, now, error=_reason(exc))
    run.training_set, run.job = training_set, job
    run.provenance = _provenance(items, kind, used)
    run.save(update_fields=["training_set", "job", "provenance"])
    return f"fired: {why}; job {job.pk}"


def _judge_gate(policy: LearningPolicy, items: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The judge's gate record when the items carry its rubrics, rewards or corrections;
    a closed gate refuses (a policy never overrides it)."""
    if not any((it.get("provenance") or {}).get("judge_result") is not None for it in items):
        return None

    return judge_gate_pass(
        deployments=[policy.deployment], uses="a learning policy's set with the judge's rubrics, rewards or corrections"
    )


def _provenance(items: list[dict[str, Any]], kind: str, used: set[int]) -> dict[str, Any]:
    comments = {c for it in items for c in (it.get("provenance") or {}).get("comments", [])}
    customer = {c for it in items for c in (it.get("provenance") or {}).get("customer_feedback", [])}
    judged = {j for it in items if (j := (it.get("provenance") or {}).get("judge_result")) is not None}
    episodes = {it["trace_id"] for it in items if kind == UseKind.EPISODE}
    return {
        "turns": len(items),
        "comments": len(comments),
        "customer_feedback": len(customer),
        "judge_results": len(judged),
        "episodes": len(episodes),
        "new": {"kind": kind, "count": len(used)},
    }


def _advance(policy: LearningPolicy, run: LearningPolicyRun, now: datetime) -> str:
    if run.stage == RunStage.TRAINING:
        job = TrainingJob.objects.filter(pk=run.job_id).select_related("result_version").first()
        if job is None:
            return _end(run, RunOutcome.ERROR, now, error="its training job was deleted")
        if job.is_active:
            return f"job {job.pk} {job.status}"
        if job.status != WorkStatus.FINISHED or job.result_version is None:
            return _end(run, RunOutcome.ERROR, now, error=f"job {job.pk} {job.status}: {job.error[:300]}".rstrip(": "))
        return _evaluate(policy, run, job.result_version, now)
    evaluation = Evaluation.objects.filter(pk=run.evaluation_id).select_related("candidate", "baseline").first()
    if evaluation is None:
        return _end(run, RunOutcome.ERROR, now, error="its evaluation was deleted")
    if evaluation.is_active:
        return f"evaluation {evaluation.pk} {evaluation.status}"
    if evaluation.status != WorkStatus.FINISHED:
        return _end(
            run,
            RunOutcome.ERROR,
            now,
            error=f"evaluation {evaluation.pk} {evaluation.status}: {evaluation.error[:300]}",
        )
    return _conclude(policy, run, evaluation, now)


def _evaluate(policy: LearningPolicy, run: LearningPolicyRun, candidate, now: datetime) -> str:
    own = run.training_set if run.training_set is not None and run.training_set.heldout_count else None
    try:
        with transaction.atomic():
            evaluation = evaluation_create(
                candidate=candidate,
                deployment=policy.deployment,
                created_by=policy.created_by,
                training_set=policy.eval_training_set or own,
                environment=policy.eval_environment,
                environment_split=policy.eval_environment_split,
                environment_tasks=policy.eval_environment_tasks,
            )
    except DomainError as exc:
        return _end(run, RunOutcome.ERROR, now, error=f"evaluation not started: {_reason(exc)}")
    run.evaluation, run.stage = evaluation, RunStage.EVALUATING
    run.save(update_fields=["evaluation", "stage"])
    return f"evaluating {candidate.name} (evaluation {evaluation.pk})"


def policy_requirements(*, policy: LearningPolicy, evaluation) -> list:
    """Each requirement of the policy as a promotion `Precondition`: the win rate and its
    lower bound, then the promotion's own checks (harm, monitors, regressions — the job's
    canaries among them — lineage, baseline still live) with no override."""
    comparison = (evaluation.summary or {}).get("comparison") or {}
    rate, low, n = comparison.get("win_rate"), comparison.get("ci_low"), comparison.get("n", 0)
    ok = rate is not None and rate >= policy.min_win_rate
    shown = f"{rate:.2f} over {n} items" if rate is not None else "no item was compared"
    checks = [
        Precondition(
            "win_rate", f"Win rate vs live ≥ {policy.min_win_rate:.2f}", ok, f"win rate {shown}", "min_win_rate"
        )
    ]
    if policy.min_win_rate_ci_low is not None:
        ok = low is not None and low > policy.min_win_rate_ci_low
        shown = f"{low:.2f}" if low is not None else "none"
        checks.append(
            Precondition(
                "win_rate_ci_low",
                f"Win rate's 95% lower bound > {policy.min_win_rate_ci_low:.2f}",
                ok,
                f"lower bound {shown} ({comparison.get('ci', 'Wilson 95%')})",
                "min_win_rate_ci_low",
            )
        )
    candidate = evaluation.candidate
    live = live_version_get(deployment_id=policy.deployment_id)
    checks += [
        check_not_live(candidate, live),
        check_deployable(candidate),
        check_evaluation_current(evaluation, live),
        check_harm(evaluation),
        check_lineage(candidate, live, ""),
    ]
    if policy.require_monitors_clean:
        checks.append(check_monitors(candidate, ""))
    if policy.require_no_regressions:
        checks.append(check_regressions(candidate, evaluation, ""))
    return checks


def _conclude(policy: LearningPolicy, run: LearningPolicyRun, evaluation, now: datetime) -> str:
    checks = policy_requirements(policy=policy, evaluation=evaluation)
    run.checks = [c.as_dict() for c in checks]
    failed = [c for c in checks if not c.ok]
    if failed:
        why = "; ".join(f"{c.label}: {c.detail}" for c in failed)
        return _end(run, RunOutcome.CHECKS_FAILED, now, error=why, fields=["checks"])
    note = (
        f"Opened by learning policy {policy.name} (run {run.pk}) on behalf of {policy.created_by.username}: "
        f"{run.reason}. Every requirement held: " + "; ".join(f"{c.label}: {c.detail}" for c in checks)
    )
    try:
        with transaction.atomic():
            promotion = promotion_request_create(
                candidate=evaluation.candidate,
                deployment=policy.deployment,
                evaluation=evaluation,
                requested_by=policy.created_by,
                note=note,
            )
            # The request's own evidence (decision 0016) plus what the policy checked.
            promotion.snapshot["learning_policy"] = {
                "policy": policy.pk,
                "name": policy.name,
                "run": run.pk,
                "reason": run.reason,
                "training_set": run.training_set_id,
                "job": run.job_id,
                "provenance": run.provenance,
                "checks": run.checks,
            }
            promotion.save(update_fields=["snapshot"])
    except (PromotionRefused, PermissionDenied) as exc:
        return _end(run, RunOutcome.CHECKS_FAILED, now, error=f"promotion request refused: {exc}", fields=["checks"])
    run.promotion = promotion
    run.notified = _notify(policy, promotion)
    return _end(run, RunOutcome.REQUESTED, now, fields=["checks", "promotion", "notified"])


def _notify(policy: LearningPolicy, promotion) -> list[str]:
    """Mail the policy's approvers (after commit); returns whom. The requester is left out:
    they cannot approve their own request; so is anyone of the group (or the user named)
    who may not approve promotions: they could not act on it, and the request is not theirs
    to read."""
    users = get_user_model().objects.filter(is_active=True).exclude(pk=policy.created_by_id)
    chosen = Q(pk=policy.notify_user_id) if policy.notify_user_id else Q(pk__in=[])
    if policy.notify_group_id:
        chosen |= Q(groups=policy.notify_group_id)
    approve = Permission.objects.filter(content_type__app_label="training", codename="approve_promotion")
    approvers = Q(is_superuser=True) | Q(groups__permissions__in=approve) | Q(user_permissions__in=approve)
    people = list(users.filter(chosen).filter(pk__in=users.filter(approvers).values("pk")).order_by("username"))
    addresses = [u.email for u in people if u.email]
    if addresses:
        subject = f"Promotion request {promotion.pk}: {promotion.candidate.name} for {policy.deployment.name}"
        # Paths written out, not reverse()d: the worker that sends this loads no URLconf or
        # view. Absolute, on the configured site: a mail client has no page to resolve a path on.
        site = settings.SITE_URL
        body = (
            f"Learning policy {policy.name} opened promotion request {promotion.pk} on behalf of "
            f"{policy.created_by.username}; it waits for an approver's decision.\n\n"
            f"Approve or reject it from your notifications, with its evidence: "
            f"{site}/notifications/#promotion-{promotion.pk}\n"
            f"The request's page: {site}/promotions/{promotion.pk}/\n"
        )
        transaction.on_commit(lambda: send_mail(subject, body, None, addresses, fail_silently=True))
    return [u.username for u in people]


def _end(
    run: LearningPolicyRun, outcome: str, now: datetime, *, error: str = "", fields: list[str] | None = None
) -> str:
    run.outcome, run.stage, run.error, run.finished_at = outcome, RunStage.DONE, error, now
    run.save(update_fields=["outcome", "stage", "error", "finished_at", *(fields or [])])
    return f"{outcome}{': ' + error if error else ''}"


def _fail_active_run(pk: int, error: str, now: datetime) -> str:
    with transaction.atomic():
        run = LearningPolicyRun.objects.select_for_update().filter(policy_id=pk, finished_at__isnull=True).first()
        if run is None:
            # Nothing was written: the next tick tries again; the page says why it has not fired.
            LearningPolicy.objects.filter(pk=pk).update(
                waiting_reason=f"the last tick failed: {error}"[:500], checked_at=now
            )
            return f"error: {error}"
        return _end(run, RunOutcome.ERROR, now, error=error[:2000])


def _reason(exc: DomainError) -> str:
    return exc.detail
