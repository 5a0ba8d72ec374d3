"""Pages for evaluation, promotion, release, rollback and the audit log (htmx).

Every button posts to a view that calls the same service the API and the admin call;
a refusal comes back as a flash message naming the unmet precondition. The release
status on a request page is a partial the page polls while the release is running.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages as flash
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from training.environments import environment_names
from training.models import TrainingSet
from training.promotion.models import (
    AuditAction,
    Evaluation,
    EvaluationItem,
    PromotionRequest,
    PromotionStatus,
)
from training.promotion.selectors import (
    audit_cursor,
    audit_cursor_text,
    audit_trail,
    candidate_versions,
    deployment_states,
    evaluation_get,
    evaluation_items,
    evaluations_recent,
    latest_evaluation,
    promotion_audit,
    promotion_get,
    promotions_recent,
    releases_of,
)
from training.promotion.services.evaluation import EvaluationError, evaluation_cancel, evaluation_create
from training.promotion.services.promotion import (
    promotion_approval_effect,
    promotion_approve,
    promotion_approve_check,
    promotion_approve_refusal,
    promotion_reject,
    promotion_request_check,
    promotion_request_create,
    promotion_withdraw,
)
from training.promotion.services.promotion_checks import PromotionRefused, check_harm, lineage
from training.promotion.services.promotion_refused import APPROVE
from training.promotion.services.promotion_signals import KIND_PREFIX, evaluation_signals, promotion_signals
from training.promotion.services.promotion_verdict import promotion_overrides, promotion_verdict
from training.promotion.services.release_plans import (
    PlanInvalid,
    release_plan_default,
    release_plan_for_approval,
    release_plans_for,
)
from training.promotion.services.rollback import rollback_check, rollback_request, rollback_target
from training.serving.models import Deployment, ModelVersion
from training.serving.selectors import live_version_get
from webapp.kernel.form_problems import FormProblems, django_form_problems
from webapp.kernel.ids import parse_id
from webapp.kernel.pages import dashboard_view

VIEW = "training.view_promotionrequest"
EVALUATE = "training.add_evaluation"
REQUEST = "training.add_promotionrequest"
AUDIT = "training.view_auditevent"


def _refused(request: HttpRequest, exc: Exception) -> None:
    flash.error(request, str(exc))


# Overview ------------------------------------------------------------------------------


class TrainingSetChoice(forms.ModelChoiceField):
    """A set named with its split, marked when it holds nothing out to evaluate on."""

    def label_from_instance(self, obj: TrainingSet) -> str:
        return obj.choice_label


class EvaluateForm(forms.Form):
    candidate = forms.ModelChoiceField(queryset=ModelVersion.objects.exclude(kind="base"), to_field_name="name")
    deployment = forms.ModelChoiceField(queryset=Deployment.objects.all(), to_field_name="name")
    training_set = TrainingSetChoice(
        queryset=TrainingSet.objects.all(), required=False, label="Held-out items of", empty_label="(none)"
    )
    trace_ids = forms.CharField(
        label="and/or traces",
        required=False,
        help_text="ids of hand-picked traces, separated by commas or spaces",
        widget=forms.TextInput(attrs={"placeholder": "e.g. 12, 40, 41"}),
    )
    max_tokens = forms.IntegerField(min_value=1, max_value=8192, required=False, label="Max tokens")
    environment = forms.ChoiceField(
        required=False,
        label="and whole episodes of",
        help_text="measures task success, collateral changes and tool calls on unknown ids",
    )
    environment_split = forms.CharField(
        required=False, max_length=50, label="split", widget=forms.TextInput(attrs={"placeholder": "test"})
    )
    environment_tasks = forms.IntegerField(min_value=1, max_value=500, required=False, label="tasks")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["environment"].choices = [("", "(none)")] + [(n, n) for n in environment_names()]

    def clean_trace_ids(self) -> list[int]:
        raw = self.cleaned_data["trace_ids"].replace(",", " ").split()
        try:
            ids = [int(x) for x in raw]
        except ValueError:
            raise forms.ValidationError("whole numbers only") from None
        if len(ids) > 500:
            raise forms.ValidationError("at most 500 trace ids")
        return ids


@dashboard_view(VIEW)
def models_overview(request: HttpRequest) -> HttpResponse:
    if request.htmx and request.GET.get("part") == "deployments":
        return render(request, "training/models.html#deployments", _deployments_context(request))
    return _models_page(request, EvaluateForm(initial=request.GET.dict()))


def _models_page(request: HttpRequest, evaluate_form: EvaluateForm, *, status: int = 200) -> HttpResponse:
    """The models page; the evaluation form as given (bound, with its errors, when it came back)."""
    context = {
        **_deployments_context(request),
        "candidates": candidate_versions(),
        "promotions": promotions_recent(limit=20),
        "evaluations": evaluations_recent(limit=15),
        "evaluate_form": evaluate_form,
        "evaluate_problems": django_form_problems(evaluate_form, prefix="evaluate")
        if evaluate_form.is_bound
        else FormProblems("evaluate"),
        "can_evaluate": request.user.has_perm(EVALUATE),
        "can_request": request.user.has_perm(REQUEST),
    }
    return render(request, "training/models.html", context, status=status)


def _deployments_context(request: HttpRequest) -> dict:
    states = deployment_states()
    return {
        "states": states,
        "any_release_active": any(s.active_release for s in states),
        "can_rollback": request.user.has_perm(APPROVE),
    }


# Evaluations ---------------------------------------------------------------------------


@require_POST
@dashboard_view(EVALUATE)
def evaluation_create_view(request: HttpRequest) -> HttpResponse:
    form = EvaluateForm(request.POST)
    if not form.is_valid():
        return _models_page(request, form, status=400)
    data = form.cleaned_data
    try:
        evaluation = evaluation_create(
            candidate=data["candidate"],
            deployment=data["deployment"],
            training_set=data["training_set"],
            trace_ids=data["trace_ids"],
            max_tokens=data["max_tokens"],
            environment=data["environment"],
            environment_split=data["environment_split"],
            environment_tasks=data["environment_tasks"],
            created_by=request.user,
        )
    except EvaluationError as exc:
        # Beside the field it names (an unknown name is the form's as a whole); every
        # selection stays as it was chosen.
        for field, reason in exc.errors:
            form.add_error(field if field in form.fields else None, reason)
        return _models_page(request, form, status=400)
    return redirect("promotion:evaluation", evaluation_id=evaluation.pk)


@dashboard_view(VIEW)
def evaluation_detail(request: HttpRequest, evaluation_id: int) -> HttpResponse:
    evaluation = evaluation_get(evaluation_id=evaluation_id)
    if evaluation is None:
        raise Http404("no such evaluation")
    signals = evaluation_signals(evaluation)
    context = {
        "evaluation": evaluation,
        "harm": check_harm(evaluation),
        "signals": signals,
        "kinds": _kinds(signals),
        "items": evaluation_items(evaluation=evaluation),
        "can_evaluate": request.user.has_perm(EVALUATE),
        "can_request": request.user.has_perm(REQUEST),
    }
    if request.htmx and request.GET.get("part") == "report":
        return render(request, "training/evaluation.html#report", context)
    return render(request, "training/evaluation.html", context)


@dashboard_view(VIEW)
def evaluation_item_detail(request: HttpRequest, evaluation_id: int, position: int) -> HttpResponse:
    evaluation = evaluation_get(evaluation_id=evaluation_id)
    item = EvaluationItem.objects.filter(evaluation_id=evaluation_id, position=position).first()
    if evaluation is None or item is None:
        raise Http404("no such item")
    neighbours = EvaluationItem.objects.filter(evaluation_id=evaluation_id)
    context = {
        "evaluation": evaluation,
        "item": item,
        "previous": neighbours.filter(position__lt=position).order_by("-position").first(),
        "next": neighbours.filter(position__gt=position).order_by("position").first(),
    }
    return render(request, "training/evaluation_item.html", context)


@require_POST
@dashboard_view(EVALUATE)
def evaluation_cancel_view(request: HttpRequest, evaluation_id: int) -> HttpResponse:
    evaluation_cancel(evaluation=get_object_or_404(Evaluation, pk=evaluation_id), user=request.user)
    flash.info(request, "The evaluation stops after the item it is on.")
    return redirect("promotion:evaluation", evaluation_id=evaluation_id)


# Promotion requests ---------------------------------------------------------------------


class PromotionForm(forms.Form):
    candidate = forms.ModelChoiceField(queryset=ModelVersion.objects.exclude(kind="base"), to_field_name="name")
    deployment = forms.ModelChoiceField(queryset=Deployment.objects.all(), to_field_name="name")
    evaluation = forms.ModelChoiceField(queryset=Evaluation.objects.all(), required=False)
    note = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False, max_length=5000)
    breach_override_reason = forms.CharField(
        label="Override a monitor breach because…", widget=forms.Textarea(attrs={"rows": 2}), required=False
    )
    rebase_reason = forms.CharField(
        label="Rebase onto the live version because…", widget=forms.Textarea(attrs={"rows": 2}), required=False
    )
    regression_override_reason = forms.CharField(
        label="Promote despite a regressing signal because…",
        widget=forms.Textarea(attrs={"rows": 2}),
        required=False,
        max_length=2000,
    )


@dashboard_view(VIEW)
def promotion_list(request: HttpRequest) -> HttpResponse:
    status = request.GET.get("status") or None
    if status and status not in PromotionStatus.values:
        raise Http404("no such status")
    context = {"promotions": promotions_recent(limit=200, status=status), "status": status}
    context["statuses"] = PromotionStatus.choices
    return render(request, "training/promotion_list.html", context)


@dashboard_view(REQUEST)
def promotion_new(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        form = PromotionForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            try:
                promotion = promotion_request_create(
                    candidate=data["candidate"],
                    deployment=data["deployment"],
                    evaluation=data["evaluation"],
                    requested_by=request.user,
                    note=data["note"],
                    breach_override_reason=data["breach_override_reason"],
                    rebase_reason=data["rebase_reason"],
                    regression_override_reason=data["regression_override_reason"],
                )
            except PromotionRefused as exc:
                form.add_error(exc.field if exc.field in form.fields else None, str(exc))
            else:
                flash.success(request, f"Promotion of {promotion.candidate.name} requested; an approver decides.")
                return redirect("promotion:promotion", promotion_id=promotion.pk)
    else:
        form = PromotionForm(initial=request.GET.dict())
    checks, signals = [], []
    if form.is_bound or request.GET.get("candidate"):
        source = form.data if form.is_bound else request.GET
        candidate = ModelVersion.objects.filter(name=source.get("candidate")).first()
        deployment = Deployment.objects.filter(name=source.get("deployment")).first()
        if candidate and deployment:
            evaluation = Evaluation.objects.filter(pk=source.get("evaluation") or 0).first() or latest_evaluation(
                candidate=candidate, deployment=deployment
            )
            if evaluation and not form.is_bound:
                form.initial["evaluation"] = evaluation.pk
            checks = promotion_request_check(
                candidate=candidate,
                deployment=deployment,
                evaluation=evaluation,
                breach_override_reason=source.get("breach_override_reason", ""),
                rebase_reason=source.get("rebase_reason", ""),
                regression_override_reason=source.get("regression_override_reason", ""),
            )
            signals = promotion_signals(candidate=candidate, evaluation=evaluation)
    context = {
        "form": form,
        "checks": checks,
        "signals": signals,
        "problems": django_form_problems(form, prefix="promotion") if form.is_bound else FormProblems("promotion"),
    }
    return render(request, "training/promotion_new.html", context, status=400 if form.is_bound else 200)


def _kinds(signals: list) -> list:
    return [s for s in signals if s.code.startswith(KIND_PREFIX)]


def _promotion_context(request: HttpRequest, promotion: PromotionRequest) -> dict:
    releases = releases_of(promotion=promotion)
    live = live_version_get(deployment_id=promotion.deployment_id)
    checks = promotion_approve_check(promotion=promotion, user=request.user)
    signals = promotion_signals(candidate=promotion.candidate, evaluation=promotion.evaluation)
    harm = check_harm(promotion.evaluation)
    snapshot = promotion.decision_snapshot or promotion.snapshot
    pending = promotion.status == PromotionStatus.PENDING
    return {
        "promotion": promotion,
        "evaluation": promotion.evaluation,
        "harm": harm,
        "signals": signals,
        "kinds": _kinds(signals),
        "verdict": promotion_verdict(
            signals=signals,
            evaluation=promotion.evaluation,
            checks=checks if pending else None,
            harm=harm,
            judge_agreement=(snapshot or {}).get("judge_agreement"),
            overrides=promotion_overrides(promotion),
            breaches=((snapshot or {}).get("monitors") or {}).get("breaches"),
        ),
        "effect": promotion_approval_effect(promotion=promotion) if pending else None,
        "plans": release_plans_for(deployment=promotion.deployment) if pending else [],
        "default_plan": release_plan_default(deployment=promotion.deployment) if pending else None,
        "releases": releases,
        "release": releases[0] if releases else None,
        "release_active": bool(releases) and releases[0].is_active,
        "live": live,
        "checks": checks,
        "can_decide": pending and all(c.ok for c in checks[:2]),
        "can_approve": all(c.ok for c in checks),
        "can_withdraw": pending and promotion.requested_by_id == request.user.pk,
        "can_rollback": (
            request.user.has_perm(APPROVE)
            and live is not None
            and live.pk == promotion.candidate_id
            and all(c.ok for c in rollback_check(deployment=promotion.deployment))
        ),
        "rollback_to": rollback_target(deployment=promotion.deployment),
        "lineage": lineage(promotion.candidate)[:8],
        "snapshot": snapshot,
        "audit": promotion_audit(promotion=promotion),
    }


@dashboard_view(VIEW)
def promotion_detail(request: HttpRequest, promotion_id: int) -> HttpResponse:
    promotion = promotion_get(promotion_id=promotion_id)
    if promotion is None:
        raise Http404("no such promotion request")
    context = _promotion_context(request, promotion)
    if request.htmx and request.GET.get("part") == "release":
        return render(request, "training/promotion.html#release", context)
    return render(request, "training/promotion.html", context)


def _decision(request: HttpRequest, promotion_id: int, act) -> HttpResponse:
    promotion = get_object_or_404(PromotionRequest, pk=promotion_id)
    try:
        act(promotion)
    except (PermissionDenied, PromotionRefused) as exc:
        _refused(request, exc)
    return redirect("promotion:promotion", promotion_id=promotion_id)


@require_POST
@dashboard_view(APPROVE)
def promotion_approve_view(request: HttpRequest, promotion_id: int) -> HttpResponse:
    """Approve once the approver has confirmed what approval does: without a confirmation of
    the effect that holds now, the answer is the confirmation page (nothing changes); a
    request that cannot be approved is refused before it is asked for."""
    comment = request.POST.get("comment", "")[:5000]
    promotion = promotion_get(promotion_id=promotion_id)
    if promotion is None:
        raise Http404("no such promotion request")
    try:
        plan = release_plan_for_approval(deployment=promotion.deployment, plan_id=request.POST.get("plan"))
    except PlanInvalid as exc:
        _refused(request, exc)
        return redirect("promotion:promotion", promotion_id=promotion_id)
    effect = promotion_approval_effect(promotion=promotion, plan=plan)
    confirmed = request.POST.get("confirm", "")
    if confirmed != effect.token:
        try:
            promotion_approve_refusal(promotion=promotion, user=request.user)
        except (PermissionDenied, PromotionRefused) as exc:
            _refused(request, exc)
            return redirect("promotion:promotion", promotion_id=promotion_id)
        context = {**_promotion_context(request, promotion), "comment": comment, "stale": bool(confirmed)}
        return render(request, "training/promotion_confirm.html", {**context, "effect": effect, "plan": plan})
    return _decision(
        request,
        promotion_id,
        lambda p: promotion_approve(promotion=p, user=request.user, comment=comment, plan=plan),
    )


@require_POST
@dashboard_view(APPROVE)
def promotion_reject_view(request: HttpRequest, promotion_id: int) -> HttpResponse:
    comment = request.POST.get("comment", "")[:5000]
    return _decision(request, promotion_id, lambda p: promotion_reject(promotion=p, user=request.user, comment=comment))


@require_POST
@dashboard_view(REQUEST)
def promotion_withdraw_view(request: HttpRequest, promotion_id: int) -> HttpResponse:
    return _decision(request, promotion_id, lambda p: promotion_withdraw(promotion=p, user=request.user))


@require_POST
@dashboard_view(APPROVE)
def rollback_view(request: HttpRequest, deployment: str) -> HttpResponse:
    target = get_object_or_404(Deployment, name=deployment)
    try:
        release = rollback_request(deployment=target, user=request.user, reason=request.POST.get("reason", "")[:500])
    except PromotionRefused as exc:
        _refused(request, exc)
    else:
        flash.success(request, f"Rolling {target.name} back to {release.version.name} (release {release.pk}).")
    back = parse_id(request.POST.get("promotion"))
    if back is not None and PromotionRequest.objects.filter(pk=back).exists():
        return redirect("promotion:promotion", promotion_id=back)
    return redirect("promotion:models")


# Audit ---------------------------------------------------------------------------------


@dashboard_view(AUDIT)
def audit_log(request: HttpRequest) -> HttpResponse:
    deployment = None
    if request.GET.get("deployment"):
        deployment = Deployment.objects.filter(name=request.GET["deployment"]).first()
        if deployment is None:
            raise Http404("no such deployment")
    asked = request.GET.get("before") or ""
    before = audit_cursor(asked) if asked else None
    context = {
        "deployment": deployment,
        "deployments": Deployment.objects.order_by("name").values_list("name", flat=True),
        "actions": AuditAction,
    }
    if asked and before is None:
        # As the API answers: a cursor that names no entry is a bad link, never the first page
        # shown as if it were the one asked for.
        context.update(events=[], next_before=None, problem=f"before: {asked[:40]!r} names no entry of the audit log")
        return render(request, "training/audit.html", context, status=400)
    events = audit_trail(deployment=deployment, before=before, limit=100)
    context.update(events=events, next_before=audit_cursor_text(events[-1]) if len(events) == 100 else None)
    return render(request, "training/audit.html", context)
