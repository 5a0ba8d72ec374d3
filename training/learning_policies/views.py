"""Learning policy pages (htmx): the list with a form to create one, and a policy's page
with its settings form and its history, which polls while a run is in progress."""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth.decorators import login_required, permission_required
from django.contrib.auth.models import Group
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render

from training.learning_policies.models import LearningPolicy, PolicySignal
from training.learning_policies.selectors import learning_policy_get, learning_policy_list
from training.learning_policies.services import (
    EDITABLE,
    PolicyError,
    learning_policy_create,
    learning_policy_refs,
    learning_policy_update,
)
from training.models import JobKind, TrainingSet
from training.serving.models import Deployment
from webapp.kernel.chat_format import json_loads_bounded
from webapp.kernel.form_problems import json_object_error, problems
from webapp.kernel.ids import parse_id

# The form's fields as its labels name them (errors are said in these words).
POLICY_LABELS = {
    "name": "Name",
    "deployment": "Deployment",
    "signal": "Signal",
    "environment": "Environment",
    "min_new_turns": "New turns with the signal, at least",
    "min_interval_minutes": "Minutes since the last run, at least",
    "job_kind": "Job kind",
    "job_config": "Job settings (JSON)",
    "heldout_fraction": "Held-out fraction of the set",
    "eval_training_set": "Held-out items of",
    "eval_environment": "Whole episodes of",
    "eval_environment_split": "Split",
    "eval_environment_tasks": "Tasks",
    "min_win_rate": "Win rate vs live, at least",
    "min_win_rate_ci_low": "Its 95% lower bound above",
    "notify_group": "Group",
    "notify_user": "User",
}
INTS = ("min_new_turns", "min_interval_minutes", "eval_environment_tasks")
FLOATS = ("heldout_fraction", "min_win_rate", "min_win_rate_ci_low")
OPTIONAL = ("eval_environment_tasks", "min_win_rate_ci_low")
CHECKBOXES = ("enabled", "require_no_regressions", "require_monitors_clean")
TEXTS = ("name", "signal", "environment", "job_kind", "eval_environment", "eval_environment_split")


def _form_values(data: QueryDict) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The form's fields as the service's typed values, and the ones that do not parse."""
    values: dict[str, Any] = {f: (data.get(f) or "").strip() for f in TEXTS}
    errors: list[tuple[str, str]] = []
    for f in CHECKBOXES:
        values[f] = data.get(f) == "on"
    for f, cast in [(f, int) for f in INTS] + [(f, float) for f in FLOATS]:
        raw = (data.get(f) or "").strip()
        if not raw and f in OPTIONAL:
            values[f] = None
            continue
        try:
            values[f] = cast(raw)
        except ValueError:
            errors.append((f, "a whole number" if cast is int else "a number"))
    try:
        values["job_config"] = json_loads_bounded(data.get("job_config") or "{}")
        if not isinstance(values["job_config"], dict):
            raise ValueError("a JSON object")
    except ValueError as exc:
        # Where the JSON breaks (line and column), once the depth check let it be read.
        deep = str(exc).startswith("nested")
        said = str(exc) if deep else json_object_error(data.get("job_config") or "{}")
        errors.append(("job_config", said or "a JSON object"))
    try:
        values |= learning_policy_refs(
            eval_training_set=(data.get("eval_training_set") or "").strip(),
            notify_group=(data.get("notify_group") or "").strip(),
            notify_user=(data.get("notify_user") or "").strip(),
        )
    except PolicyError as exc:
        errors += exc.errors
    return {k: v for k, v in values.items() if k in EDITABLE}, errors


def _choices() -> dict[str, Any]:
    return {
        "deployments": Deployment.objects.order_by("name"),
        "signals": PolicySignal.choices,
        "kinds": [(v, label) for v, label in JobKind.choices if v != JobKind.EPISODES],
        "eval_sets": TrainingSet.objects.filter(heldout_count__gt=0).order_by("-created_at")[:100],
        "groups": Group.objects.order_by("name"),
    }


def _as_form(policy: LearningPolicy) -> dict[str, Any]:
    form: dict[str, Any] = {f: getattr(policy, f) for f in EDITABLE}
    form["job_config"] = json.dumps(policy.job_config or {})
    form["eval_training_set"] = policy.eval_training_set_id or ""
    form["notify_group"] = policy.notify_group.name if policy.notify_group_id else ""
    form["notify_user"] = policy.notify_user.username if policy.notify_user_id else ""
    form["deployment"] = policy.deployment.name
    return form


NEW_FORM = {
    "enabled": True,
    "signal": PolicySignal.COMMENTS,
    "min_new_turns": 10,
    "min_interval_minutes": 0,
    "job_kind": JobKind.DISTILL,
    "job_config": "{}",
    "heldout_fraction": 0.2,
    "min_win_rate": 0.5,
    "require_no_regressions": True,
    "require_monitors_clean": True,
}


@login_required
@permission_required("training.view_learningpolicy", raise_exception=True)
def policy_list(request: HttpRequest) -> HttpResponse:
    form, errors = dict(NEW_FORM), []
    if request.method == "GET" and parse_id(request.GET.get("eval_training_set")) is not None:
        # An evaluation slice's page links here with itself as the set to evaluate on.
        form["eval_training_set"] = parse_id(request.GET["eval_training_set"])
    if request.method == "POST":
        if not request.user.has_perm("training.add_learningpolicy"):
            raise PermissionDenied("setting up learning policies needs the operator or admin role")
        form = request.POST.dict()
        form["enabled"] = "enabled" in request.POST
        values, errors = _form_values(request.POST)
        deployment = None
        try:
            deployment = learning_policy_refs(deployment=(request.POST.get("deployment") or "").strip())["deployment"]
        except PolicyError as exc:
            errors += exc.errors
        if not errors:
            try:
                policy = learning_policy_create(deployment=deployment, user=request.user, **values)
                return redirect("training:policy-detail", policy_id=policy.pk)
            except PolicyError as exc:
                errors = exc.errors
    context = {"policies": learning_policy_list(), "form": form, "errors": errors, **_choices()}
    context["problems"] = problems(errors, labels=POLICY_LABELS, prefix="policy")
    return render(request, "training/policy_list.html", context, status=400 if errors else 200)


@login_required
@permission_required("training.view_learningpolicy", raise_exception=True)
def policy_detail(request: HttpRequest, policy_id: int) -> HttpResponse:
    policy = learning_policy_get(policy_id=policy_id)
    if policy is None:
        raise Http404("no such learning policy")
    errors: list[tuple[str, str]] = []
    form = _as_form(policy)
    if request.method == "POST":
        if not request.user.has_perm("training.change_learningpolicy"):
            raise PermissionDenied("changing learning policies needs the operator or admin role")
        form = request.POST.dict() | {"deployment": policy.deployment.name}
        for f in CHECKBOXES:
            form[f] = f in request.POST
        values, errors = _form_values(request.POST)
        if not errors:
            try:
                learning_policy_update(policy=policy, user=request.user, **values)
                return redirect("training:policy-detail", policy_id=policy.pk)
            except PolicyError as exc:
                errors = exc.errors
    runs = policy.recent_runs
    context = {
        "policy": policy,
        "runs": runs,
        "active": any(r.is_active for r in runs),
        "form": form,
        "errors": errors,
        "problems": problems(errors, labels=POLICY_LABELS, prefix="policy"),
        **_choices(),
    }
    if request.htmx and request.GET.get("part") == "history":
        return render(request, "training/policy_detail.html#history", context)
    return render(request, "training/policy_detail.html", context, status=400 if errors else 200)
