"""The judge's pages: overview with backfill jobs and recent judgements, one judgement's
details, the agreement page, and re-judging a turn by hand."""

from __future__ import annotations

from types import SimpleNamespace

from django import forms
from django.conf import settings
from django.contrib import messages as flash
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import trigger_client_event

from feedback.judge.client import JudgeNotConfigured
from feedback.judge.prompts import CURRENT_ACTION, CURRENT_TURN
from feedback.models import CorrectionMode, DeploymentJudge, JudgeJob, JudgeResult, JudgeStatus, JudgeTrigger, Message
from feedback.permissions import BROWSE, can_see_customer_feedback
from feedback.selectors.judge import (
    agreement_by_version,
    judge_endpoint_for,
    judge_result_doubts,
    judge_results_for_messages,
)
from feedback.selectors.judge_gate import judge_training_gate, judgements_mark_unverified
from feedback.services.judge_jobs import judge_job_cancel, judge_job_create
from feedback.services.judging import JudgeError, deployment_judge_set, judge_request
from feedback.views.traces import trace_or_404
from training.serving.models import Deployment
from webapp.kernel.form_problems import django_form_problems
from webapp.kernel.pages import dashboard_view, safe_next

RUN_JUDGE = "feedback.add_judgejob"
SET_JUDGE = "feedback.change_deploymentjudge"


class BackfillForm(forms.Form):
    deployment = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    since = forms.DateTimeField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    limit = forms.IntegerField(min_value=1, max_value=100_000, initial=500)
    only_unjudged = forms.BooleanField(required=False, initial=True, label="Only turns not judged by this version")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["deployment"].choices = [("", "all"), *Deployment.objects.values_list("id", "name")]


def _endpoint_summary() -> dict:
    try:
        endpoint = judge_endpoint_for()
    except JudgeNotConfigured as exc:
        return {"configured": False, "reason": str(exc)}
    return {
        "configured": True,
        "model": endpoint.model,
        "base_url": endpoint.base_url,
        "schema_mode": endpoint.schema_mode,
        "correction_mode": endpoint.correction_mode,
        "prompt_version": CURRENT_ACTION.version if endpoint.correction_mode == "actions" else CURRENT_TURN.version,
    }


def _jobs_context() -> dict:
    jobs = list(JudgeJob.objects.select_related("deployment", "created_by")[:20])
    # A backfill's failures say why, in the words of its latest one (one query, however many).
    failing = [j.pk for j in jobs if j.failed]
    latest: dict[int, str] = {}
    if failing:
        rows = JudgeResult.objects.filter(job_id__in=failing, status=JudgeStatus.FAILED).order_by("-id")
        for job_id, reason in rows.values_list("job_id", "error")[: 20 * len(failing)]:
            latest.setdefault(job_id, reason)
    for job in jobs:
        job.latest_failure = latest.get(job.pk, "")
    return {"jobs": jobs, "any_active": any(j.is_active for j in jobs)}


@dashboard_view(BROWSE)
def judge_overview(request: HttpRequest) -> HttpResponse:
    if request.htmx and request.GET.get("part") == "jobs":
        return render(request, "feedback/judge_overview.html#jobs", _jobs_context())
    return _judge_page(request, BackfillForm())


def _judge_page(request: HttpRequest, form: BackfillForm, *, status: int = 200) -> HttpResponse:
    """The judge page, with the backfill form as given (bound, with its errors, when it came back)."""
    recent = list(JudgeResult.objects.select_related("trace", "message").order_by("-created_at", "-id")[:50])
    judgements_mark_unverified(recent)
    context = {
        "endpoint": _endpoint_summary(),
        "form": form,
        "problems": django_form_problems(form, prefix="backfill") if form.is_bound else None,
        "recent": recent,
        "can_run": request.user.has_perm(RUN_JUDGE),
        "can_set": request.user.has_perm(SET_JUDGE),
        "deployment_judges": DeploymentJudge.objects.select_related("deployment").order_by("deployment__name"),
        "correction_modes": CorrectionMode.choices,
        "min_kappa": settings.JUDGE_REWARD_MIN_KAPPA,
        "min_n": settings.JUDGE_REWARD_MIN_N,
        **_jobs_context(),
    }
    return render(request, "feedback/judge_overview.html", context, status=status)


@require_POST
@dashboard_view(RUN_JUDGE)
def judge_job_create_view(request: HttpRequest) -> HttpResponse:
    form = BackfillForm(request.POST)
    if not form.is_valid():
        return _judge_page(request, form, status=400)
    data = form.cleaned_data
    deployment = Deployment.objects.filter(pk=data["deployment"]).first() if data["deployment"] else None
    try:
        job = judge_job_create(
            deployment=deployment,
            since=data["since"],
            limit=data["limit"],
            only_unjudged=data["only_unjudged"],
            created_by=request.user,
        )
    except (JudgeNotConfigured, JudgeError) as exc:
        flash.error(request, str(exc))
    else:
        flash.success(request, f"Backfill job {job.pk} queued.")
    return redirect("feedback:judge")


@require_POST
@dashboard_view(SET_JUDGE)
def deployment_judge_mode_view(request: HttpRequest, deployment_id: int) -> HttpResponse:
    """Switch how a deployment's judge gives corrected turns: written, or chosen among the
    agent's actions."""
    judge = get_object_or_404(DeploymentJudge.objects.select_related("deployment"), pk=deployment_id)
    mode = request.POST.get("correction_mode", "")
    if mode not in CorrectionMode.values:
        flash.error(request, f"correction_mode: must be one of {', '.join(CorrectionMode.values)}")
        return redirect("feedback:judge")
    deployment_judge_set(
        deployment=judge.deployment,
        base_url=judge.base_url,
        model=judge.model,
        api_key_env=judge.api_key_env,
        schema_mode=judge.schema_mode,
        correction_mode=mode,
    )
    flash.success(request, f"{judge.deployment.name}: corrections {CorrectionMode(mode).label.lower()}.")
    return redirect("feedback:judge")


@require_POST
@dashboard_view(RUN_JUDGE)
def judge_job_cancel_view(request: HttpRequest, job_id: int) -> HttpResponse:
    job = judge_job_cancel(job=get_object_or_404(JudgeJob, pk=job_id))
    if request.htmx:
        return render(request, "feedback/judge_overview.html#jobs", _jobs_context())
    flash.info(request, f"Job {job.pk}: {job.get_status_display().lower()}.")
    return redirect("feedback:judge")


@dashboard_view(BROWSE)
def judge_result_detail(request: HttpRequest, result_id: int) -> HttpResponse:
    result = get_object_or_404(
        JudgeResult.objects.select_related("trace__deployment", "message", "job", "requested_by"), pk=result_id
    )
    trace_or_404(request, result.trace_id)
    judgements_mark_unverified([result])
    context = {
        "result": result,
        "comments": result.comments.select_related("author"),
        "customer_feedback": result.customer_feedback.all() if can_see_customer_feedback(request.user) else [],
        "human_corrections": result.human_corrections.select_related("author"),
        "swap_checks": result.swap_checks.all(),
        "older": JudgeResult.objects.filter(message_id=result.message_id).exclude(pk=result.pk)[:20],
        "doubts": judge_result_doubts(result),
    }
    return render(request, "feedback/judge_result.html", context)


def _turn_message(request: HttpRequest, trace_id: int, position: int) -> Message:
    trace = trace_or_404(request, trace_id)
    message = Message.objects.filter(trace=trace, position=position).first()
    if message is None:
        raise Http404("no such message")
    message.trace = trace
    return message


def _judge_fragment(request: HttpRequest, message: Message, *, judge_error: str = "") -> HttpResponse:
    """The judge block of one turn, as the trace page shows it (and polls while pending)."""
    context = {
        "turn": SimpleNamespace(message=message),
        "trace": message.trace,
        "judgements": judge_results_for_messages(message_ids=[message.pk]),
        "can_judge": request.user.has_perm(RUN_JUDGE),
        "here": safe_next(request, ""),
        "judge_error": judge_error,
    }
    return render(request, "feedback/_judge_turn.html", context)


@require_POST
@dashboard_view(RUN_JUDGE)
def judge_turn_view(request: HttpRequest, trace_id: int, position: int) -> HttpResponse:
    """Queue a judgement of one turn. From the trace page (htmx) the turn's judge block comes
    back showing it pending, and polls until the worker has written the result."""
    message = _turn_message(request, trace_id, position)
    default = reverse("feedback:trace-detail", args=[trace_id]) + f"#msg-{position}"
    error = ""
    try:
        judge_endpoint_for(deployment=message.trace.deployment)
        judge_request(message=message, trigger=JudgeTrigger.MANUAL, requested_by=request.user)
    except (JudgeNotConfigured, JudgeError) as exc:
        error = str(exc)
    if request.htmx:
        return _judge_fragment(request, message, judge_error=error)
    if error:
        flash.error(request, error)
    else:
        flash.success(request, f"Turn #{position} queued for judging; its result appears under the turn.")
    return redirect(safe_next(request, default))


@dashboard_view()
def judge_turn_status(request: HttpRequest, trace_id: int, position: int) -> HttpResponse:
    """The judge block of one turn (what the trace page polls while a judgement is under way);
    once the judgement is over, the side panel is told to refresh its summary."""
    message = _turn_message(request, trace_id, position)
    response = _judge_fragment(request, message)
    latest = JudgeResult.objects.filter(message=message).order_by("-created_at", "-id").only("status").first()
    if request.htmx and latest is not None and latest.status in (JudgeStatus.SUCCEEDED, JudgeStatus.FAILED):
        trigger_client_event(response, "trace-changed")
    return response


@dashboard_view(BROWSE)
def judge_agreement(request: HttpRequest) -> HttpResponse:
    deployment = None
    if request.GET.get("deployment"):
        deployment = Deployment.objects.filter(name=request.GET["deployment"]).first()
        if deployment is None:
            raise Http404("no such deployment")

    context = {
        "rows": agreement_by_version(deployment=deployment),
        "training_gate": judge_training_gate(deployment=deployment),
        "deployment": deployment,
        "deployments": Deployment.objects.values_list("name", flat=True),
        "min_kappa": settings.JUDGE_REWARD_MIN_KAPPA,
        "min_n": settings.JUDGE_REWARD_MIN_N,
        "threshold": settings.JUDGE_PASS_THRESHOLD,
    }
    return render(request, "feedback/judge_agreement.html", context)
