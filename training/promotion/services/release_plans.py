"""Release plans: the steps a candidate's share of traffic goes through, with each step's
minimum and the thresholds of the live signals (`training.promotion.services.rollout_signals`).

A deployment is offered its own plans and those of no deployment, plus "all at once" (no
plan: the candidate takes all traffic when its release goes live, as before there were plans).
"""

from __future__ import annotations

import math
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils.text import slugify

from training.promotion.rollout_models import ReleasePlan
from training.promotion.services.rollout_signals import DEFAULT_THRESHOLDS
from training.serving.models import Deployment
from webapp.kernel.errors import Invalid

MAX_STEPS = 10
# A step's least number of conversations the candidate must serve where the plan names none
# (every step but the last needs at least 1: a step never advances on no evidence).
DEFAULT_MIN_CONVERSATIONS = 50
# A plan's threshold is a worsening of a rate or a mean (latency's is relative: 0.25 is 25 %).
THRESHOLD_LIMITS = {code: (0.0, 10.0 if code == "latency" else 1.0) for code in DEFAULT_THRESHOLDS}
# What `release_plan_ensure_default` creates for a deployment with no plan of its own.
DEFAULT_STEPS = [
    {"share": 0.05, "min_conversations": 50, "min_minutes": 30},
    {"share": 0.25, "min_conversations": 200, "min_minutes": 60},
    {"share": 1.0, "min_conversations": 0, "min_minutes": 0},
]


class PlanInvalid(Invalid, ValueError):
    """A plan's steps or thresholds cannot be used; names the entry."""


def _number(value: Any, where: str, *, low: float, high: float, integer: bool = False) -> float:
    # An infinity would reach int() below (OverflowError), a NaN pass every comparison.
    finite = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if isinstance(value, bool) or not finite:
        raise PlanInvalid(f"a number from {low:g} to {high:g}", field=where)
    if integer and int(value) != value:
        raise PlanInvalid("a whole number", field=where)
    if not low <= value <= high:
        raise PlanInvalid(f"from {low:g} to {high:g}, not {value:g}", field=where)
    return int(value) if integer else float(value)


def plan_steps_clean(steps: Any) -> list[dict[str, Any]]:
    """The steps as stored: 1 to 10, shares rising above 0 to exactly 1 at the last; each but
    the last with a minimum of at least 1 conversation (`DEFAULT_MIN_CONVERSATIONS` if absent)."""
    if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS:
        raise PlanInvalid(f"a list of 1 to {MAX_STEPS} steps", field="steps")
    out: list[dict[str, Any]] = []
    for i, step in enumerate(steps):
        where = f"steps[{i}]"
        if not isinstance(step, dict):
            raise PlanInvalid("an object with share, min_conversations and min_minutes", field=where)
        unknown = set(step) - {"share", "min_conversations", "min_minutes"}
        if unknown:
            raise PlanInvalid(f"unknown field {sorted(unknown)[0]!r}", field=where)
        share = _number(step.get("share"), f"{where}.share", low=0.001, high=1.0)
        if out and share <= out[-1]["share"]:
            raise PlanInvalid("each step's share must be larger than the one before", field=f"{where}.share")
        # The last step is where the plan ends, never checked; every other needs evidence.
        last = i == len(steps) - 1
        out.append(
            {
                "share": share,
                "min_conversations": _number(
                    step.get("min_conversations", 0 if last else DEFAULT_MIN_CONVERSATIONS),
                    f"{where}.min_conversations",
                    low=0 if last else 1,
                    high=10**7,
                    integer=True,
                ),
                "min_minutes": _number(step.get("min_minutes", 0), f"{where}.min_minutes", low=0, high=60 * 24 * 30),
            }
        )
    if out[-1]["share"] != 1.0:
        raise PlanInvalid("the last step takes all traffic (share 1)", field=f"steps[{len(out) - 1}].share")
    return out


def plan_thresholds_clean(thresholds: Any) -> dict[str, float]:
    if thresholds in (None, ""):
        return {}
    if not isinstance(thresholds, dict):
        raise PlanInvalid("an object of signal code to threshold", field="thresholds")
    out = {}
    for code, value in thresholds.items():
        if code not in THRESHOLD_LIMITS:
            raise PlanInvalid(f"unknown signal; one of {', '.join(THRESHOLD_LIMITS)}", field=f"thresholds.{code}")
        low, high = THRESHOLD_LIMITS[code]
        out[code] = _number(value, f"thresholds.{code}", low=low, high=high)
    return out


@transaction.atomic
def release_plan_create(
    *,
    name: str,
    steps: Any,
    deployment: Deployment | None = None,
    thresholds: Any = None,
    description: str = "",
    is_default: bool = False,
) -> ReleasePlan:
    """A new plan (for `deployment`, or offered to every deployment); `is_default` makes it
    the one the approval form preselects for its deployment (unsetting any other)."""
    slug = slugify(name)[:60]
    if not slug:
        raise PlanInvalid("letters, digits, '-' or '_'", field="name")
    if ReleasePlan.objects.filter(deployment=deployment, name=slug).exists():
        raise PlanInvalid(f"a plan named {slug!r} exists", field="name")
    plan = ReleasePlan.objects.create(
        deployment=deployment,
        name=slug,
        description=description[:300],
        steps=plan_steps_clean(steps),
        thresholds=plan_thresholds_clean(thresholds),
        is_default=is_default,
    )
    if is_default:
        ReleasePlan.objects.filter(deployment=deployment, is_default=True).exclude(pk=plan.pk).update(is_default=False)
    return plan


def release_plan_revise(*, plan: ReleasePlan, steps: Any, thresholds: Any = None, description: str = "") -> bool:
    """Give `plan` these steps, thresholds and description; False when it had them already.
    A rollout keeps the copy of the plan it was approved with, so none under way changes."""
    wanted = {
        "steps": plan_steps_clean(steps),
        "thresholds": plan_thresholds_clean(thresholds),
        "description": description[:300],
    }
    if all(getattr(plan, k) == v for k, v in wanted.items()):
        return False
    for k, v in wanted.items():
        setattr(plan, k, v)
    plan.save(update_fields=list(wanted))
    return True


def release_plans_for(*, deployment: Deployment) -> list[ReleasePlan]:
    """The plans an approver of `deployment`'s requests may choose: its own, then the shared ones."""
    plans = ReleasePlan.objects.filter(Q(deployment=deployment) | Q(deployment__isnull=True))
    return sorted(plans, key=lambda p: (p.deployment_id is None, p.name))


def release_plan_default(*, deployment: Deployment) -> ReleasePlan | None:
    """The plan preselected for `deployment`: its own default, else a shared default, else none
    (all at once)."""
    plans = [p for p in release_plans_for(deployment=deployment) if p.is_default]
    return plans[0] if plans else None


def release_plan_ensure_default(*, deployment: Deployment) -> ReleasePlan:
    """`deployment`'s default plan, creating "progressive" (5 % -> 25 % -> 100 %) when it has none."""
    plan = release_plan_default(deployment=deployment)
    if plan is not None:
        return plan
    return release_plan_create(
        name="progressive",
        deployment=deployment,
        steps=DEFAULT_STEPS,
        description="5 % then 25 % of conversations, then all",
        is_default=True,
    )


def release_plan_for_approval(*, deployment: Deployment, plan_id: Any) -> ReleasePlan | None:
    """The plan an approval chose: an id among those offered, "" or None for all at once."""
    if plan_id in (None, "", "all", 0, "0"):
        return None
    try:
        pk = int(plan_id)
    except (TypeError, ValueError):
        raise PlanInvalid("a plan's id, or empty for all at once", field="plan") from None
    plan = next((p for p in release_plans_for(deployment=deployment) if p.pk == pk), None)
    if plan is None:
        raise PlanInvalid(f"no plan {pk} is offered to {deployment.name}", field="plan")
    return plan
