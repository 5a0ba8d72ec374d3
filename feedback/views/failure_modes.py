"""The failure-modes page: start a run over a batch of traces, follow its progress, and
read the flags per day and the named clusters of the latest run."""

from __future__ import annotations

from django import forms
from django.contrib import messages as flash
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from feedback.models import FailureCluster
from feedback.permissions import BROWSE
from feedback.selectors.failure_modes import failure_mode_runs, flag_counts_by_day, latest_finished_run, run_clusters
from feedback.services.chat_format import FieldError
from feedback.services.failure_modes import (
    FailureModeError,
    failure_cluster_dismiss,
    failure_cluster_rename,
    failure_mode_run_create,
)
from feedback.views.common import dashboard_view
from training.serving.models import Deployment

START_RUN = "feedback.add_failuremoderun"
DAYS = 14


class RunForm(forms.Form):
    deployment = forms.TypedChoiceField(required=False, coerce=int, empty_value=None)
    since = forms.DateTimeField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateTimeField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    max_traces = forms.IntegerField(min_value=1, max_value=100_000, initial=10_000, label="At most traces")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["deployment"].choices = [("", "all"), *Deployment.objects.values_list("id", "name")]


def _runs_context() -> dict:
    runs = failure_mode_runs()
    return {"runs": runs, "any_active": any(r.is_active for r in runs)}


@dashboard_view(BROWSE)
def failure_modes(request: HttpRequest) -> HttpResponse:
    if request.htmx and request.GET.get("part") == "runs":
        return render(request, "feedback/failure_modes.html#runs", _runs_context())
    days, series = flag_counts_by_day(days=DAYS)
    latest = latest_finished_run()
    context = {
        "form": RunForm(),
        "can_run": request.user.has_perm(START_RUN),
        "days": days,
        "series": series,
        "latest": latest,
        "clusters": run_clusters(run=latest) if latest else [],
        **_runs_context(),
    }
    return render(request, "feedback/failure_modes.html", context)


@require_POST
@dashboard_view(START_RUN)
def failure_mode_run_create_view(request: HttpRequest) -> HttpResponse:
    form = RunForm(request.POST)
    if not form.is_valid():
        for field, errors in form.errors.items():
            flash.error(request, f"{field}: {'; '.join(errors)}")
        return redirect("feedback:failure-modes")
    data = form.cleaned_data
    deployment = Deployment.objects.filter(pk=data["deployment"]).first() if data["deployment"] else None
    try:
        run = failure_mode_run_create(
            deployment=deployment,
            since=data["since"],
            until=data["until"],
            max_traces=data["max_traces"],
            created_by=request.user,
        )
    except FailureModeError as exc:
        flash.error(request, str(exc))
    else:
        flash.success(request, f"Failure-mode run {run.pk} queued.")
    return redirect("feedback:failure-modes")


def _cluster_response(request: HttpRequest, cluster: FailureCluster, status: int = 200, **extra) -> HttpResponse:
    if request.htmx:
        context = {"c": cluster, "can_run": True, **extra}
        return render(request, "feedback/failure_modes.html#cluster", context, status=status)
    if extra.get("rename_error"):
        flash.error(request, f"name: {extra['rename_error']}")
    return redirect("feedback:failure-modes")


@require_POST
@dashboard_view(START_RUN)
def failure_cluster_rename_view(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_object_or_404(FailureCluster, pk=cluster_id)
    name = request.POST.get("name", "")
    try:
        failure_cluster_rename(cluster=cluster, name=name)
    except FieldError as exc:
        return _cluster_response(request, cluster, status=400, rename_error=exc.reason, rename_value=name)
    return _cluster_response(request, cluster)


@require_POST
@dashboard_view(START_RUN)
def failure_cluster_dismiss_view(request: HttpRequest, cluster_id: int) -> HttpResponse:
    cluster = get_object_or_404(FailureCluster, pk=cluster_id)
    return _cluster_response(request, failure_cluster_dismiss(cluster=cluster, user=request.user))
