"""Progressive release: a candidate's walk through its plan's steps of traffic.

- **Start.** Approval with a plan creates the rollout (`starting`) beside the release that
  loads and smoke-tests the candidate on every replica; where that release would flip the live
  pointer, it routes the first step's share to the candidate instead (`rollout_begin`, under
  the release's row lock) and the rollout runs. A release that fails ends the rollout `failed`.
- **Check.** `rollouts_tick` (Celery beat) reads each running or held rollout's signals on the
  conversations both versions served since the step began and acts on the decision
  (`rollout_signals.rollout_decision`): the next step, a rollback, or nothing yet. A held
  rollout does not advance, but is still rolled back.
- **By hand.** An approver may hold, resume, advance or roll back at any step. Advancing by
  hand moves on less evidence than the plan asks, and resuming another person's hold overrules
  them: both take the same four eyes as approval (another approver than the requester, with no
  hand in the requester's account). A hold, resume or advance names the step the person saw
  and is refused where the rollout has moved since (the check runs beside the page).
- **End.** The last step flips the live pointer (a promotion, the request's) and drops the
  split; a rollback drops the split, so every conversation goes back to the live version that
  never stopped serving, and unloads the candidate once no request can still be running on it.

Every change writes a `RolloutChange` (who or "automatic", from, to, why, the signals) and an
audit event; an automatic rollback also mails the requester and the approver.
"""

from __future__ import annotations

import logging
from datetime import datetime

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from training.promotion.models import AuditAction, PromotionRequest, PromotionStatus, Release
from training.promotion.rollout_models import ACTIVE_STATES, ReleasePlan, Rollout, RolloutChange, RolloutState
from training.promotion.services.four_eyes import check_independent
from training.promotion.services.promotion_refused import APPROVE, PromotionRefused
from training.promotion.services.rollout_signals import Decision, rollout_evaluate, side_measure
from training.services.audit import audit_record
from training.serving.models import LiveChangeKind, ModelVersionKind
from training.serving.services import live_version_set
from training.serving.splits import canary_split_clear, canary_split_set
from training.tasks import release_adapter_unload_task
from webapp.kernel.errors import Invalid

logger = logging.getLogger(__name__)

AUTOMATIC = "automatic"
MAX_CHECKS = 500
# The states the check reads: a held rollout does not advance, but is still rolled back.
WATCHED = (RolloutState.RUNNING, RolloutState.HELD)


def rollout_create(*, promotion: PromotionRequest, release: Release, plan: ReleasePlan, user) -> Rollout:
    """The rollout of an approved request, waiting for its release to load the candidate."""
    rollout = Rollout.objects.create(
        deployment=promotion.deployment,
        candidate=promotion.candidate,
        baseline=release.from_version,
        promotion=promotion,
        release=release,
        plan=plan.as_chosen(),
        state=RolloutState.STARTING,
        reason=f"approved with plan {plan.name}",
    )
    _change(rollout, user, "", None, None, f"approved by {user.username} with plan {plan.name}")
    return rollout


def rollout_active(*, deployment_id: int) -> Rollout | None:
    return Rollout.objects.filter(deployment_id=deployment_id, state__in=ACTIVE_STATES).first()


def _change(
    rollout: Rollout,
    user,
    from_state: str,
    from_step: int | None,
    from_share: float | None,
    reason: str,
    signals: list | None = None,
) -> RolloutChange:
    actor = user if getattr(user, "pk", None) else None
    change = RolloutChange.objects.create(
        rollout=rollout,
        actor=actor,
        actor_name=actor.username if actor else AUTOMATIC,
        from_state=from_state,
        to_state=rollout.state,
        from_step=from_step,
        to_step=rollout.step if rollout.state != RolloutState.FAILED else None,
        from_share=from_share,
        to_share=rollout.share,
        reason=reason[:5000],
        signals=[s.as_dict() for s in signals or []],
    )
    audit_record(
        action=AuditAction.ROLLOUT_CHANGED,
        deployment=rollout.deployment,
        actor=actor,
        from_version=rollout.baseline,
        to_version=rollout.candidate,
        promotion=rollout.promotion,
        release=rollout.release,
        detail=f"{rollout.get_state_display()} at {rollout.share:.0%}: {reason}",
        data={"rollout": rollout.pk, "from_step": from_step, "to_step": change.to_step, "to_state": rollout.state},
    )
    return change


def _locked(rollout_id: int) -> Rollout:
    return (
        Rollout.objects.select_for_update(of=("self",))
        .select_related("deployment", "candidate__base_model", "baseline", "promotion__requested_by", "release")
        .get(pk=rollout_id)
    )


def _route(rollout: Rollout) -> None:
    canary_split_set(
        deployment=rollout.deployment, version=rollout.candidate, share=rollout.share, rollout_id=rollout.pk
    )


# Start (the release's worker) -------------------------------------------------------------


def rollout_begin(*, release: Release) -> bool:
    """Called by the release's worker where it would flip the live pointer, in that
    transaction: if a rollout waits on this release, route its first step and say so (the
    pointer then stays where it is)."""
    waiting = Rollout.objects.filter(release=release, state=RolloutState.STARTING).values_list("pk", flat=True).first()
    if waiting is None:
        return False
    rollout = _locked(waiting)
    now = timezone.now()
    rollout.state, rollout.step, rollout.step_started_at = RolloutState.RUNNING, 0, now
    rollout.reason = "the candidate is loaded on every replica and passed its smoke test"
    rollout.save(update_fields=["state", "step", "step_started_at", "reason"])
    _route(rollout)
    _change(rollout, None, RolloutState.STARTING, None, 0.0, rollout.reason)
    return True


def rollout_release_ended(*, release: Release) -> None:
    """The release that was to load the candidate failed or was cancelled: so did the rollout."""
    for rollout in Rollout.objects.filter(release=release, state=RolloutState.STARTING):
        rollout.state, rollout.ended_at = RolloutState.FAILED, timezone.now()
        rollout.reason = (release.error or f"release {release.get_status_display().lower()}")[:500]
        rollout.save(update_fields=["state", "ended_at", "reason"])
        _change(rollout, None, RolloutState.STARTING, None, 0.0, rollout.reason)


# Moves -----------------------------------------------------------------------------------


def _unload_later(version) -> None:
    if version is None or version.kind != ModelVersionKind.LORA:
        return

    release_adapter_unload_task.apply_async_on_commit(
        args=[version.pk], queue="deploy", countdown=settings.RELEASE_UNLOAD_AFTER_SECONDS
    )


def _advance(rollout: Rollout, user, reason: str, signals: list | None = None) -> Rollout:
    from_state, from_step, from_share = rollout.state, rollout.step, rollout.share
    now = timezone.now()
    rollout.step += 1
    rollout.step_started_at, rollout.reason = now, reason[:500]
    if rollout.step >= len(rollout.steps) - 1:
        rollout.step = len(rollout.steps) - 1
        rollout.state, rollout.ended_at = RolloutState.COMPLETE, now
        canary_split_clear(deployment=rollout.deployment)
        person = user if getattr(user, "pk", None) else None
        live_version_set(
            deployment=rollout.deployment,
            version=rollout.candidate,
            user=person,
            reason=f"progressive release {rollout.pk} complete",
            kind=LiveChangeKind.PROMOTION,
            request_made_at=rollout.promotion.requested_at,
            promotion_id=rollout.promotion_id,
            release_id=rollout.release_id,
        )
        PromotionRequest.objects.filter(pk=rollout.promotion_id).update(status=PromotionStatus.DEPLOYED)
        _unload_later(rollout.baseline)
    else:
        rollout.state = RolloutState.RUNNING
        _route(rollout)
    rollout.save(update_fields=["step", "step_started_at", "reason", "state", "ended_at"])
    _change(rollout, user, from_state, from_step, from_share, reason, signals)
    return rollout


def _rollback(rollout: Rollout, user, reason: str, signals: list | None = None) -> Rollout:
    from_state, from_step, from_share = rollout.state, rollout.step, rollout.share
    rollout.state, rollout.ended_at, rollout.reason = RolloutState.ROLLED_BACK, timezone.now(), reason[:500]
    rollout.save(update_fields=["state", "ended_at", "reason"])
    canary_split_clear(deployment=rollout.deployment)
    PromotionRequest.objects.filter(pk=rollout.promotion_id).update(status=PromotionStatus.ROLLED_BACK)
    _change(rollout, user, from_state, from_step, from_share, reason, signals)
    _unload_later(rollout.candidate)
    if user is None:
        _mail_rollback(rollout, reason)
    return rollout


def _mail_rollback(rollout: Rollout, reason: str) -> None:
    """Tell the requester and the approver (after commit); paths written out: a worker sends it."""
    people = [rollout.promotion.requested_by, rollout.promotion.decided_by]
    addresses = sorted({u.email for u in people if u is not None and u.email})
    if not addresses:
        return
    subject = f"Rolled back: {rollout.candidate.name} on {rollout.deployment.name} at {rollout.steps[rollout.step]['share']:.0%}"
    body = (
        f"The progressive release {rollout.pk} of {rollout.candidate.name} was rolled back automatically.\n\n"
        f"Why: {reason}\n\nEvery conversation is served by {rollout.baseline.name} again.\n"
        f"The release's page: {settings.SITE_URL}/rollouts/{rollout.pk}/\n"
    )
    transaction.on_commit(lambda: send_mail(subject, body, None, addresses, fail_silently=True))


def _may_act(user) -> None:
    if not (user is not None and user.is_authenticated and user.has_perm(APPROVE)):
        raise PermissionDenied(f"your role does not include {APPROVE}")


def _reason(reason: str) -> str:
    reason = (reason or "").strip()
    if "\x00" in reason:
        raise PromotionRefused("contains a NUL character", field="reason")
    return reason


def _share_text(share: float) -> str:
    return f"{100 * share:g} %"


def _as_seen(rollout: Rollout, seen_step: int | None, seen_share: float | None) -> None:
    """Refuse a move decided on a step the rollout has since left (the check advanced it, or
    another approver did): "advance" meant from there, not from here. Called under the row lock."""
    if seen_step is not None and not 0 <= seen_step < len(rollout.steps):
        raise Invalid(f"a step of this plan, 0 to {len(rollout.steps) - 1}", field="step")
    if seen_share is not None and not 0 <= seen_share <= 1:  # NaN fails this too
        raise Invalid("a share from 0 to 1", field="share")
    if seen_step is not None and seen_step != rollout.step:
        field, seen = "step", rollout.steps[seen_step]["share"]
    elif seen_share is not None and abs(seen_share - rollout.share) > 1e-9:
        field, seen = "share", seen_share
    else:
        return
    raise PromotionRefused(
        f"the release moved to {_share_text(rollout.share)} since you loaded the page "
        f"(you saw {_share_text(seen)}): reload it and decide again",
        field=field,
    )


@transaction.atomic
def rollout_hold(
    *, rollout: Rollout, user, reason: str = "", seen_step: int | None = None, seen_share: float | None = None
) -> Rollout:
    """Keep the candidate at its step: the automatic check leaves a held rollout alone."""
    _may_act(user)
    reason = _reason(reason)
    rollout = _locked(rollout.pk)
    if rollout.state != RolloutState.RUNNING:
        raise PromotionRefused(f"rollout {rollout.pk} is {rollout.get_state_display().lower()}", field="state")
    _as_seen(rollout, seen_step, seen_share)
    rollout.state, rollout.reason = RolloutState.HELD, (reason or f"held by {user.username}")[:500]
    rollout.save(update_fields=["state", "reason"])
    _change(rollout, user, RolloutState.RUNNING, rollout.step, rollout.share, reason or "held")
    return rollout


@transaction.atomic
def rollout_resume(
    *, rollout: Rollout, user, reason: str = "", seen_step: int | None = None, seen_share: float | None = None
) -> Rollout:
    """Let the automatic check decide a held rollout's steps again."""
    _may_act(user)
    reason = _reason(reason)
    rollout = _locked(rollout.pk)
    if rollout.state != RolloutState.HELD:
        raise PromotionRefused(f"rollout {rollout.pk} is {rollout.get_state_display().lower()}", field="state")
    _as_seen(rollout, seen_step, seen_share)
    _resume_four_eyes(rollout, user)
    rollout.state, rollout.reason = RolloutState.RUNNING, (reason or f"resumed by {user.username}")[:500]
    rollout.save(update_fields=["state", "reason"])
    _change(rollout, user, RolloutState.HELD, rollout.step, rollout.share, reason or "resumed")
    return rollout


def _resume_four_eyes(rollout: Rollout, user) -> None:
    """Resuming one's own hold is anyone's; resuming another person's hold overrules them,
    which the requester may not do."""
    hold = rollout.changes.filter(to_state=RolloutState.HELD).order_by("-pk").first()
    if hold is not None and hold.actor_id != user.pk:
        _four_eyes(rollout, user)


def _four_eyes(rollout: Rollout, user) -> None:
    """A step by hand skips the evidence the plan asks for: never the requester's own call."""
    if rollout.promotion.requested_by_id == user.pk:
        raise PermissionDenied("you requested this promotion: another approver must take this step by hand")
    independent = check_independent(rollout.promotion, user)
    if not independent.ok:
        raise PermissionDenied(independent.detail)


@transaction.atomic
def rollout_advance(
    *, rollout: Rollout, user, reason: str = "", seen_step: int | None = None, seen_share: float | None = None
) -> Rollout:
    """Move from the step the person saw (`seen_step` / `seen_share`) to the next one now,
    whatever the check would say: on less evidence than the plan asks, so it takes the four
    eyes of an approval."""
    _may_act(user)
    reason = _reason(reason)
    rollout = _locked(rollout.pk)
    if rollout.state not in (RolloutState.RUNNING, RolloutState.HELD):
        raise PromotionRefused(f"rollout {rollout.pk} is {rollout.get_state_display().lower()}", field="state")
    _as_seen(rollout, seen_step, seen_share)
    _four_eyes(rollout, user)
    return _advance(rollout, user, reason or f"advanced by {user.username}")


@transaction.atomic
def rollout_rollback(
    *, rollout: Rollout, user, reason: str = "", seen_step: int | None = None, seen_share: float | None = None
) -> Rollout:
    """End the rollout now: every conversation goes back to the live version. What was seen is
    not held against it: going back to live is what was asked at any step."""
    _may_act(user)
    reason = _reason(reason)
    rollout = _locked(rollout.pk)
    if rollout.state not in ACTIVE_STATES or rollout.state == RolloutState.STARTING:
        raise PromotionRefused(f"rollout {rollout.pk} is {rollout.get_state_display().lower()}", field="state")
    return _rollback(rollout, user, reason or f"rolled back by {user.username}")


# The automatic check ---------------------------------------------------------------------


def rollout_measure(rollout: Rollout, now: datetime) -> tuple[Decision, dict]:
    """The decision the check would take now, and what it read (for `last_check`)."""
    since = rollout.step_started_at or rollout.started_at
    cand = side_measure(deployment_id=rollout.deployment_id, version_id=rollout.candidate_id, since=since, until=now)
    live = side_measure(deployment_id=rollout.deployment_id, version_id=rollout.baseline_id, since=since, until=now)
    minutes = (now - since).total_seconds() / 60
    decision = rollout_evaluate(
        deployment=rollout.deployment,
        cand=cand,
        live=live,
        step=rollout.steps[rollout.step],
        minutes=minutes,
        thresholds=rollout.plan.get("thresholds"),
    )
    signals = decision.signals
    read = {
        "at": now.isoformat(),
        "step": rollout.step,
        "share": rollout.share,
        "since": since.isoformat(),
        "candidate": cand.as_dict(),
        "live": live.as_dict(),
        "signals": [s.as_dict() for s in signals],
        "action": decision.action,
        "reason": decision.reason,
    }
    return decision, read


@transaction.atomic
def rollout_check(*, rollout_id: int, now: datetime | None = None) -> Decision | None:
    """Read one running or held rollout's signals and act on them; None when it is neither.
    A hold stops the advance, not the rollback: a held candidate that regresses is taken out."""
    now = now or timezone.now()
    rollout = _locked(rollout_id)
    if rollout.state not in WATCHED:
        return None
    decision, read = rollout_measure(rollout, now)
    if rollout.state == RolloutState.HELD and decision.action == "advance":
        decision = Decision("wait", f"held: {decision.reason}", decision.signals)
        read |= {"action": decision.action, "reason": decision.reason}
    rollout.checked_at, rollout.last_check = now, read
    brief = {k: read[k] for k in ("at", "step", "share", "action")} | {"signals": _brief(read["signals"])}
    rollout.checks = [*rollout.checks[-(MAX_CHECKS - 1) :], brief]
    rollout.save(update_fields=["checked_at", "last_check", "checks"])
    if decision.action == "rollback":
        _rollback(rollout, None, decision.reason, decision.signals)
    elif decision.action == "advance":
        _advance(rollout, None, decision.reason, decision.signals)
    return decision


def _brief(signals: list[dict]) -> dict[str, list]:
    """Per signal: candidate, live, interval low and high (the release page's series)."""
    return {s["code"]: [s["candidate"], s["live"], s["ci_low"], s["ci_high"]] for s in signals}


def rollouts_tick(*, now: datetime | None = None) -> dict[int, str]:
    """Check every running or held rollout once; returns what each did ("advance", "wait", "rollback")."""
    done: dict[int, str] = {}
    for pk in Rollout.objects.filter(state__in=WATCHED).values_list("pk", flat=True):
        try:
            decision = rollout_check(rollout_id=pk, now=now)
        except Exception:
            # One rollout's failure (its deployment's judge unreachable, say) must not stop the others'.
            logger.exception("progressive release %s: the check failed", pk)
            continue
        if decision is not None:
            done[pk] = decision.action
    return done
