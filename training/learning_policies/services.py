"""Learning policies: create and edit them (the tick that runs them is `tick`)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify

from training.environments import environment_get
from training.learning_policies.models import LearningPolicy, PolicySignal
from training.models import JobKind, TrainingSet
from training.services.jobs import JobError, training_job_config_check
from training.serving.models import Deployment
from training.serving.selectors import live_version_get
from webapp.kernel.errors import Invalid
from webapp.kernel.ids import parse_id

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


def learning_policy_check(*, deployment: Deployment | None, values: dict[str, Any]) -> None:
    """Every problem with `values` for a policy of `deployment`, as one `PolicyError`. The
    recipe goes through the jobs' own config validation, from the live version it will train."""
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
