"""The failure-modes page: start a run over a batch of traces, follow its progress, and
read the flags per day and the named clusters of the latest run."""

from __future__ import annotations

from django import forms
from django.contrib import messages as flash
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect

from feedback.failure_modes.selectors import failure_mode_runs, flag_counts_by_day, latest_finished_run, run_clusters
from feedback.failure_modes.services import (
    FailureModeError,
    failure_cluster_dismiss,
    failure_cluster_rename,
    failure_mode_run_create,
)
from feedback.models import FailureCluster, FailureModeRun
from feedback.permissions import BROWSE, BUILD_QUEUE
from feedback.services.queues import queue_from_failure_cluster
from training.serving.models import Deployment
from webapp.kernel.chat_format import FieldError
from webapp.kernel.form_problems import django_form_problems
from webapp.kernel.ids import parse_id
from webapp.kernel.pages import dashboard_view

START_RUN = "feedback.add_failuremoderun"
# "Make an evaluation slice" builds a training set: the training sets' permission, by name,
# since the slice's view lives with the training sets (feedback imports no training app).
BUILD_SET = "training.add_trainingset"
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


def cluster_actions(user) -> dict[str, bool]:
    """Which of a cluster's buttons the person may use."""
    return {
        "can_run": user.has_perm(START_RUN),
        "can_queue": user.has_perm(BUILD_QUEUE),
        "can_slice": user.has_perm(BUILD_SET),
    }


@dashboard_view(BROWSE)
def failure_modes(request: HttpRequest) -> HttpResponse:
    """The latest finished run's clusters, or those of `?run=<id>` (where a queue's or an
    evaluation slice's "from failure mode" link points)."""
    if request.htmx and request.GET.get("part") == "runs":
        return render(request, "feedback/failure_modes.html#runs", _runs_context())
    status = 200
    latest = latest_finished_run()
    shown = latest
    if request.GET.get("run"):
        run_id = parse_id(request.GET["run"])
        if run_id is None:
            flash.error(request, "run: a failure-mode run's id (a whole number)")
            status = 400
        else:
            shown = get_object_or_404(FailureModeRun.objects.select_related("deployment"), pk=run_id)
    return _failure_modes_page(request, RunForm(), shown=shown, latest=latest, status=status)


def _failure_modes_page(request: HttpRequest, form: RunForm, *, shown, latest, status: int = 200) -> HttpResponse:
    """The page, with the run form as given (bound, with its errors, when it came back)."""
    days, series = flag_counts_by_day(days=DAYS)
    context = {
        "form": form,
        "problems": django_form_problems(form, prefix="run") if form.is_bound else None,
        **cluster_actions(request.user),
        "days": days,
        "series": series,
        "latest": shown,
        "is_latest": latest is not None and shown is not None and shown.pk == latest.pk,
        "clusters": run_clusters(run=shown) if shown else [],
        **_runs_context(),
    }
    return render(request, "feedback/failure_modes.html", context, status=status)


@require_POST
@dashboard_view(START_RUN)
def failure_mode_run_create_view(request: HttpRequest) -> HttpResponse:
    form = RunForm(request.POST)
    if not form.is_valid():
        latest = latest_finished_run()
        return _failure_modes_page(request, form, shown=latest, latest=latest, status=400)
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
        cluster.queue = cluster.queues.first()
        context = {"c": cluster, **cluster_actions(request.user), **extra}
        return render(request, "feedback/failure_modes.html#cluster", context, status=status)
    if extra.get("rename_error"):
        flash.error(request, f"name: {extra['rename_error']}")
    if extra.get("action_error"):
        flash.error(request, extra["action_error"])
    return redirect(f"{reverse('feedback:failure-modes')}?run={cluster.run_id}#cluster-{cluster.pk}")


def cluster_refused(request: HttpRequest, cluster: FailureCluster, reason: str) -> HttpResponse:
    """A cluster's button refused: for htmx, the cluster again with the reason beside its
    buttons (400); for a plain form, back to the cluster with the reason on top of the page."""
    return _cluster_response(request, cluster, status=400, action_error=reason)


def go_to(request: HttpRequest, url: str) -> HttpResponse:
    """Open `url`: htmx follows it as a whole page, a plain form post by a redirect."""
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


@require_POST
@dashboard_view(BUILD_QUEUE)
def failure_cluster_queue_view(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """The "Review in a queue" button: the cluster's traces as an annotation queue, opened;
    a second click opens the same queue."""
    if not request.user.has_perm(BROWSE):
        raise PermissionDenied(f"your role does not include {BROWSE}")
    cluster = get_object_or_404(FailureCluster, pk=cluster_id)
    try:
        queue, created = queue_from_failure_cluster(cluster=cluster, created_by=request.user)
    except FieldError as exc:
        return cluster_refused(request, cluster, exc.reason)
    if created:
        flash.success(request, f"Queue “{queue.name}” holds the failure mode's {queue.item_count} traces.")
    else:
        flash.info(request, f"This failure mode is already in queue “{queue.name}”: here it is.")
    return go_to(request, reverse("feedback:queue-detail", kwargs={"queue_id": queue.pk}))


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
