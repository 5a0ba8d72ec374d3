"""Learning policies: create and edit them, and the periodic tick that runs them.

The tick (`learning_policies_tick`, a Celery beat task) never waits for work to finish: each
call moves every policy one step at most and returns.

    no active run ──(trigger holds)──► fire: set from new feedback, job queued   [training]
    job finished ──► evaluation of the candidate vs the live version queued       [evaluating]
    evaluation finished ──► requirements checked ──► promotion request opened     [done]
                                                 └─► checks failed, reasons kept  [done]

A policy never puts a version live: the request waits for another person's approval, as one
a person opened would (`training.services.promotion`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Max, Q
from django.utils import timezone
from django.utils.text import slugify

from training.learning_policies.models import (
    LearningPolicy,
    LearningPolicyRun,
    LearningPolicyUse,
    PolicySignal,
    RunOutcome,
    RunStage,
    UseKind,
)
from training.serving.models import Deployment
from training.serving.selectors import live_version_get
from webapp.errors import DomainError, Invalid
from webapp.ids import parse_id
from webapp.work import WorkStatus

logger = logging.getLogger(__name__)

# Fields a person sets; the rest is the tick's.
EDITABLE = (
    "name",
    "enabled",
    "signal",
    "environment",
    "min_new_turns",
    "min_interval_minutes",
    "job_kind",
    "job_config",
    "heldout_fraction",
    "eval_training_set",
    "eval_environment",
    "eval_environment_split",
    "eval_environment_tasks",
    "min_win_rate",
    "min_win_rate_ci_low",
    "require_no_regressions",
    "require_monitors_clean",
    "notify_group",
    "notify_user",
)


# What the person who answers for a policy must still be allowed to do for it to fire.
RUNS_NEED = (
    "training.add_trainingset",
    "training.add_trainingjob",
    "training.add_evaluation",
    "training.add_promotionrequest",
)
# What the columns hold; the API's serializer has the same bounds.
TEXT_LIMITS = {"name": 100, "environment": 100, "eval_environment": 100, "eval_environment_split": 20}
INT_LIMITS = {"min_new_turns": 1_000_000, "min_interval_minutes": 525_600, "eval_environment_tasks": 10_000}


class PolicyError(Invalid, ValueError):
    """A policy that cannot be saved; `errors` lists (field, reason) pairs (400)."""

    def __init__(self, errors: list[tuple[str, str]]):
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors), errors=errors)


# Create / edit -------------------------------------------------------------------------


def learning_policy_check(*, deployment: Deployment | None, values: dict[str, Any]) -> None:
    """Every problem with `values` for a policy of `deployment`, as one `PolicyError`. The
    recipe goes through the jobs' own config validation, from the live version it will train."""
    from training.environments import environment_get
    from training.models import JobKind
    from training.services.jobs import JobError, training_job_config_check

    errors: list[tuple[str, str]] = []
    if deployment is None:
        raise PolicyError([("deployment", "choose a deployment")])
    for f, longest in TEXT_LIMITS.items():
        v = values.get(f)
        if v is not None and (not isinstance(v, str) or len(v) > longest or "\x00" in v):
            errors.append((f, f"text of at most {longest} characters, without NUL"))
    name = values.get("name") or ""
    if not name or slugify(name) != name:
        errors.append(("name", "letters, digits, hyphens and underscores"))
    signal = values.get("signal")
    if signal not in PolicySignal.values:
        errors.append(("signal", f"one of {', '.join(PolicySignal.values)}"))
    for env_field, needed in (
        ("environment", signal == PolicySignal.EPISODES),
        ("eval_environment", False),
    ):
        env = values.get(env_field) or ""
        if needed and not env:
            errors.append((env_field, "graded episodes need the environment they come from"))
        if env:
            try:
                environment_get(env)
            except KeyError:
                errors.append((env_field, f"no environment named {env!r}"))
    turns, minutes = values.get("min_new_turns"), values.get("min_interval_minutes")
    for f, v in (("min_new_turns", turns), ("min_interval_minutes", minutes)):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= INT_LIMITS[f]:
            errors.append((f, f"a whole number from 0 to {INT_LIMITS[f]:,}"))
    if isinstance(turns, int) and isinstance(minutes, int) and turns == 0 and minutes == 0:
        errors.append(("min_new_turns", "set a number of new turns or a minimum interval (or both)"))
    heldout = values.get("heldout_fraction")
    if not isinstance(heldout, int | float) or not 0 <= heldout < 1:
        errors.append(("heldout_fraction", "a fraction in [0, 1)"))
    for f in ("min_win_rate", "min_win_rate_ci_low"):
        v = values.get(f)
        if v is None and f == "min_win_rate_ci_low":
            continue
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0 <= v <= 1:
            errors.append((f, "a rate between 0 and 1"))
    tasks = values.get("eval_environment_tasks")
    if tasks is not None and (
        not isinstance(tasks, int) or isinstance(tasks, bool) or not 1 <= tasks <= INT_LIMITS["eval_environment_tasks"]
    ):
        errors.append(("eval_environment_tasks", f"a whole number from 1 to {INT_LIMITS['eval_environment_tasks']:,}"))
    if (
        heldout == 0
        and not isinstance(heldout, bool)
        and values.get("eval_training_set") is None
        and not values.get("eval_environment")
    ):
        errors.append(
            ("heldout_fraction", "hold items out, or choose a set or an environment to evaluate on: nothing would")
        )
    if values.get("eval_training_set") is not None and not values["eval_training_set"].heldout_count:
        errors.append(("eval_training_set", f"{values['eval_training_set']} has no held-out items"))
    live = live_version_get(deployment_id=deployment.pk)
    kind = values.get("job_kind")
    if live is None:
        errors.append(("deployment", f"{deployment.name} has no live version to train from"))
    elif kind == JobKind.EPISODES:
        errors.append(("job_kind", "a policy trains on the set it builds: grpo, distill or sft"))
    else:
        try:
            training_job_config_check(kind=kind, config=values.get("job_config"), base_version=live)
        except JobError as exc:
            errors += [
                (f.replace("config", "job_config", 1) if f.startswith("config") else f"job_{f}", r)
                for f, r in exc.errors
            ]
    if errors:
        raise PolicyError(errors)


def learning_policy_refs(
    *,
    deployment: str | int | None = None,
    eval_training_set: str | int | None = None,
    notify_group: str | None = None,
    notify_user: str | None = None,
) -> dict[str, Any]:
    """The rows a form or an API body names (a deployment by name or id, a training set by
    id, a group and a user by name); only the ones given, blank meaning none. Raises
    `PolicyError` naming each one that does not exist."""
    from django.contrib.auth.models import Group

    from training.models import TrainingSet

    out: dict[str, Any] = {}
    errors: list[tuple[str, str]] = []

    def one(name: str, value, queryset, by: str, what: str):
        if value is None:
            return
        if value == "":
            out[name] = None
            return
        text = str(value)
        if "\x00" in text or len(text) > 200:
            errors.append((name, f"no {what} with such a name"))
            return
        row = queryset.filter(**{by: text}).first()
        if row is None and by != "pk" and parse_id(text) is not None:
            row = queryset.filter(pk=parse_id(text)).first()
        if row is None:
            errors.append((name, f"no {what} {text!r}"))
        out[name] = row

    one("deployment", deployment, Deployment.objects.all(), "name", "deployment")
    if eval_training_set not in (None, "") and not parse_id(str(eval_training_set)):
        errors.append(("eval_training_set", "a training set's id"))
    else:
        one("eval_training_set", eval_training_set, TrainingSet.objects.all(), "pk", "training set")
    one("notify_group", notify_group, Group.objects.all(), "name", "group")
    one("notify_user", notify_user, get_user_model().objects.filter(is_active=True), "username", "user")
    if errors:
        raise PolicyError(errors)
    return out


@transaction.atomic
def learning_policy_create(*, deployment: Deployment | None, user, **values: Any) -> LearningPolicy:
    """A new policy of `deployment`; `user` answers for the promotion requests it opens."""
    values = _with_defaults(values)
    learning_policy_check(deployment=deployment, values=values)
    if LearningPolicy.objects.filter(deployment=deployment, name=values["name"]).exists():
        raise PolicyError([("name", f"{deployment.name} already has a policy named {values['name']}")])
    try:
        with transaction.atomic():
            return LearningPolicy.objects.create(deployment=deployment, created_by=user, **values)
    except IntegrityError:  # the same name saved at the same moment
        raise PolicyError([("name", f"{deployment.name} already has a policy named {values['name']}")]) from None


@transaction.atomic
def learning_policy_update(*, policy: LearningPolicy, user, **values: Any) -> LearningPolicy:
    """Change the fields given; the run in progress keeps the recipe it started with.

    `user` answers for the policy from now on (its `created_by`): the requests it opens are
    theirs, so the four-eyes rule keeps whoever last set its requirements from approving
    them. Left with the creator, an approver who may edit policies (an admin) could lower
    a policy's requirements and approve the request it opens in someone else's name."""
    policy = LearningPolicy.objects.select_for_update().get(pk=policy.pk)
    unknown = sorted(set(values) - set(EDITABLE))
    if unknown:
        raise PolicyError([(f, "cannot be changed") for f in unknown])
    merged = {f: getattr(policy, f) for f in EDITABLE} | values
    learning_policy_check(deployment=policy.deployment, values=merged)
    if LearningPolicy.objects.filter(deployment=policy.deployment, name=merged["name"]).exclude(pk=policy.pk).exists():
        raise PolicyError([("name", f"{policy.deployment.name} already has a policy named {merged['name']}")])
    for f, v in values.items():
        setattr(policy, f, v)
    policy.created_by = user
    policy.updated_at = timezone.now()
    try:
        with transaction.atomic():
            policy.save(update_fields=[*values, "created_by", "updated_at"])
    except IntegrityError:
        raise PolicyError([("name", f"{policy.deployment.name} already has a policy named {merged['name']}")]) from None
    return policy


def _with_defaults(values: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(values) - set(EDITABLE))
    if unknown:
        raise PolicyError([(f, "unknown field") for f in unknown])
    defaults = {f: LearningPolicy._meta.get_field(f).get_default() for f in EDITABLE}
    defaults["eval_training_set"] = defaults["notify_group"] = defaults["notify_user"] = None
    return defaults | values


# The new feedback a policy would learn from --------------------------------------------


@dataclass
class NewSignal:
    """What arrived for a policy that no run of it used: the rows by kind, the turns they
    are on, and when the newest came."""

    turns: int = 0
    newest: datetime | None = None
    what: str = "turns"
    ids: dict[str, set[int]] = field(default_factory=dict)


def _unused(policy: LearningPolicy, kind: str):
    return LearningPolicyUse.objects.filter(policy=policy, kind=kind).values("object_id")


def _signal_rows(policy: LearningPolicy):
    """(queryset of new rows, the use kind, what a unit is called, the field naming its turn)."""
    from feedback.models import Comment, CustomerFeedback, JudgeResult, Trace
    from feedback.models.judge import JudgeStatus

    deployment = policy.deployment
    if policy.signal == PolicySignal.COMMENTS:
        rows = Comment.objects.filter(trace__deployment=deployment, message__role="assistant")
        return rows.exclude(pk__in=_unused(policy, UseKind.COMMENT)), UseKind.COMMENT, "commented turns", "message_id"
    if policy.signal == PolicySignal.CUSTOMER:
        rows = CustomerFeedback.objects.filter(deployment=deployment, message__role="assistant")
        return (
            rows.exclude(pk__in=_unused(policy, UseKind.CUSTOMER)),
            UseKind.CUSTOMER,
            "turns with customer feedback",
            "message_id",
        )
    if policy.signal == PolicySignal.JUDGE:
        rows = JudgeResult.objects.filter(trace__deployment=deployment, is_latest=True, status=JudgeStatus.SUCCEEDED)
        return rows.exclude(pk__in=_unused(policy, UseKind.JUDGE)), UseKind.JUDGE, "judged turns", "message_id"
    rows = Trace.objects.filter(deployment=deployment, environment=policy.environment, metadata__split="train")
    return rows.exclude(pk__in=_unused(policy, UseKind.EPISODE)), UseKind.EPISODE, "graded episodes", "id"


def new_signal(*, policy: LearningPolicy) -> NewSignal:
    """How much new feedback of the policy's signal there is (two aggregate queries)."""
    rows, _kind, what, turn = _signal_rows(policy)
    figures = rows.aggregate(newest=Max("created_at"))
    return NewSignal(turns=rows.values(turn).distinct().count(), newest=figures["newest"], what=what)


def _items_for(policy: LearningPolicy) -> tuple[list[dict[str, Any]], str, set[int]]:
    """The training items of the new feedback, its use kind, and the ids of the rows used.

    A turn is included when it carries at least one row of the signal no run used; its item
    is built as `training_set_from_feedback` builds it (with the turn's other feedback as
    context), and only the new rows are recorded as used."""
    from training.services.episode_sets import episode_turn_items
    from training.services.feedback_sets import MAX_TRACES, turn_items

    rows, kind, _what, _turn = _signal_rows(policy)
    if kind == UseKind.EPISODE:
        new_traces = set(rows.values_list("pk", flat=True)[:MAX_TRACES])
        items = episode_turn_items(deployment=policy.deployment, environment=policy.environment, split="train")
        items = [it for it in items if it["trace_id"] in new_traces]
        return items, kind, {it["trace_id"] for it in items}
    new_ids = set(rows.values_list("pk", flat=True)[:MAX_TRACES])
    trace_ids = sorted(set(rows.filter(pk__in=new_ids).values_list("trace_id", flat=True)))
    key = {UseKind.COMMENT: "comments", UseKind.CUSTOMER: "customer_feedback", UseKind.JUDGE: "judge_result"}[kind]
    kept, used = [], set()
    for item in turn_items(trace_ids=trace_ids):
        found = item["provenance"][key]
        ids = set(found if isinstance(found, list) else [found] if found is not None else [])
        if ids & new_ids:
            kept.append(item)
            used |= ids & new_ids
    return kept, kind, used


# The tick ------------------------------------------------------------------------------


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
        from feedback.selectors.judge_gate import judge_training_gate

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
    from training.services.jobs import training_job_create
    from training.services.training_sets import training_set_create

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
    from training.services.judge_gate import judge_gate_pass

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
    from training.models import TrainingJob
    from training.promotion.models import Evaluation

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
    from training.services.evaluation import evaluation_create

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
    from training.services.promotion_checks import (
        Precondition,
        check_deployable,
        check_evaluation_current,
        check_harm,
        check_lineage,
        check_monitors,
        check_not_live,
        check_regressions,
    )

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
    from training.services.promotion import promotion_request_create
    from training.services.promotion_checks import PromotionRefused

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
    from django.contrib.auth.models import Permission

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
