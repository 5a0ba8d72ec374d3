"""Training pages: the job list with a start form, and the live job page (htmx)."""

from __future__ import annotations

import json
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from feedback.failure_modes.views import cluster_refused, go_to
from feedback.forms import TraceFilterForm
from feedback.models import AnnotationQueue, FailureCluster
from feedback.permissions import BROWSE
from training import selectors
from training.environments import environment_names
from training.models import JobKind, TrainingSet
from training.services.episode_sets import training_set_from_episodes
from training.services.evaluation_slices import evaluation_slice_from_failure_cluster
from training.services.feedback_sets import training_set_from_feedback
from training.services.jobs import JobError, training_job_cancel, training_job_create
from training.services.training_sets import TrainingSetError
from training.serving.models import Deployment, ModelVersion
from webapp.kernel.form_problems import FormProblems, json_object_error, problems
from webapp.kernel.ids import form_id, parse_id
from webapp.kernel.pages import dashboard_view

# The form's common fields; anything else goes in the JSON box.
FORM_FIELDS = {
    "steps": int,
    "learning_rate": float,
    "group_size": int,
    "prompts_per_step": int,
    "max_new_tokens": int,
    "adapter": str,
    "beta": float,
    "hint_samples": int,
}

# Each form's fields as its labels name them: errors are said in these words.
JOB_LABELS = {
    "kind": "Kind",
    "base_version": "Train from version",
    "training_set": "Training set",
    "steps": "Steps",
    "learning_rate": "Learning rate",
    "group_size": "Group size",
    "prompts_per_step": "Prompts per step",
    "max_new_tokens": "Max new tokens",
    "adapter": "Weights",
    "beta": "KL weight β",
    "hint_samples": "Hinted samples",
    "config": "Other settings (JSON)",
    "judge_gate_override_reason": "Override the judge's training gate",
}
SET_LABELS = {
    "name": "Name",
    "heldout_fraction": "Held-out fraction",
    "queue": "From a queue",
    "filters": "Trace-list filters",
    "judge_gate_override_reason": "Override the judge's training gate",
}
EPISODE_LABELS = {
    "name": "Name",
    "heldout_fraction": "Held-out fraction",
    "deployment": "Deployment",
    "environment": "Environment",
    "variants": "Counterfactual copies of each decision",
}


@login_required
@permission_required("training.view_trainingjob", raise_exception=True)
def job_list(request: HttpRequest) -> HttpResponse:
    errors: list[tuple[str, str]] = []
    form = {"kind": "grpo", "config": "{}"}
    forms: dict = {}
    if request.method == "GET" and request.htmx and request.GET.get("part") == "usable":
        _, wrong = form_id(request.GET, "training_set")
        if wrong:
            return HttpResponse(f"training_set: {wrong[0][1]}", status=400, content_type="text/plain")
        return render(request, "training/job_list.html#usable", _usable_context(request.GET.dict()))
    if request.method == "GET":
        # The tour links here with its path filled in: the set from operators' comments
        # (`filters`) and the job kind that learns from them (`kind`).
        if request.GET.get("kind") in JobKind.values:
            form["kind"] = request.GET["kind"]
        if request.GET.get("filters"):
            forms["set_form"] = {
                "name": "operator-comments",
                "heldout_fraction": "0.2",
                "filters": request.GET["filters"][:2000],
            }
    if request.method == "POST":
        if not request.user.has_perm("training.add_trainingjob"):
            raise PermissionDenied("starting training jobs needs the operator or admin role")
        form = request.POST.dict()
        job, errors = _create_from_form(request)
        if job is not None:
            usable = selectors.training_set_usable(kind=job.kind, training_set=job.training_set)
            if usable is not None and usable.few:
                flash.warning(request, f"Job #{job.pk} trains on {usable.sentence()}.")
            return redirect("training:job-detail", job_id=job.pk)
    job_problems = problems(errors, labels=JOB_LABELS, prefix="job")
    return _job_list_page(request, status=400 if errors else 200, errors=job_problems, form=form, **forms)


def _job_list_page(request: HttpRequest, *, status: int = 200, **forms) -> HttpResponse:
    """The jobs page, with the forms' values and errors given in `forms` (the job form's
    `form`/`errors`, the training-set forms' `set_form`/`set_errors` and
    `episode_form`/`episode_errors`) and every other form empty."""
    training_sets = list(selectors.training_sets())
    form = forms.pop("form", None) or {"kind": "grpo", "config": "{}"}
    if not form.get("training_set") and training_sets:
        form["training_set"] = str(training_sets[0].pk)
    if not form.get("base_version"):
        # The version the deployment serves now: a job trains on from what is live, not from
        # the newest candidate nobody approved.
        live = selectors.live_version_to_train_from(
            training_set=next((s for s in training_sets if str(s.pk) == form["training_set"]), None)
        )
        if live is not None:
            form["base_version"] = str(live.pk)
    context = {
        "jobs": selectors.training_job_list(),
        "versions": selectors.versions_with_gaps(),
        "min_hint_gap": settings.TRAINING_MIN_HINT_GAP,
        "live_versions": selectors.live_version_names(),
        "training_sets": training_sets,
        "kinds": JobKind.choices,
        "errors": FormProblems("job"),
        "form": form,
        **_usable_context(form, training_sets=training_sets),
        "queues": _queues(),
        "set_form": {"heldout_fraction": "0.2"},
        "set_errors": FormProblems("set"),
        "episode_errors": FormProblems("episode"),
        # The defaults build the demo's set as they stand: the support desk's episodes of support-bot.
        "episode_form": {
            "heldout_fraction": "0.15",
            "name": "support-desk-episodes",
            "deployment": "support-bot",
            "environment": "support-desk",
        },
        **_episode_choices(),
        **forms,
    }
    return render(request, "training/job_list.html", context, status=status)


def _create_from_form(request: HttpRequest):
    errors: list[tuple[str, str]] = []
    data = request.POST
    wrong = json_object_error(data.get("config") or "{}")
    if wrong:  # said with the other fields' errors, not alone
        errors.append(("config", wrong))
    config = {} if wrong else json.loads(data.get("config") or "{}")
    for name, cast in FORM_FIELDS.items():
        raw = (data.get(name) or "").strip()
        if raw:
            try:
                config[name] = cast(raw)
            except ValueError:
                errors.append((name, "must be a whole number" if cast is int else "must be a number"))
    version_id, wrong_version = form_id(data, "base_version")
    set_id, wrong_set = form_id(data, "training_set")
    version = ModelVersion.objects.filter(pk=version_id).first() if version_id else None
    training_set = TrainingSet.objects.filter(pk=set_id).first() if set_id else None
    if version is None:
        errors += wrong_version or [("base_version", "choose a model version to train from")]
    if training_set is None and (wrong_set or data.get("kind") != JobKind.EPISODES):
        errors += wrong_set or [("training_set", "choose a training set")]
    if errors:
        return None, errors
    try:
        job = training_job_create(
            kind=data.get("kind", ""),
            config=config,
            base_version=version,
            training_set=training_set,
            user=request.user,
            judge_gate_override_reason=data.get("judge_gate_override_reason") or "",
        )
    except JobError as exc:
        return None, exc.errors
    return job, []


def _usable_context(data: dict, *, training_sets: list[TrainingSet] | None = None) -> dict:
    """What the job form says before Start: how many of the chosen set's items the chosen
    method can train on."""
    chosen, _ = form_id(data, "training_set")
    if training_sets is not None:
        training_set = next((s for s in training_sets if s.pk == chosen), None)
    else:
        training_set = TrainingSet.objects.filter(pk=chosen).first() if chosen else None
    kind = data.get("kind") or JobKind.GRPO
    usable = selectors.training_set_usable(kind=kind, training_set=training_set) if training_set else None
    return {"usable": usable}


@login_required
@permission_required("training.view_trainingjob", raise_exception=True)
def job_detail(request: HttpRequest, job_id: int) -> HttpResponse:
    job = selectors.training_job_get(job_id=job_id)
    if job is None:
        raise Http404("no such job")
    series, evals, progress = selectors.job_live(job=job)
    charts = selectors.job_chart_specs(
        job=job, series=series, evals=evals, checkpoints=selectors.job_checkpoint_steps(job=job)
    )
    sample_steps = selectors.job_sample_steps(job=job)
    chosen = parse_id(request.GET.get("sample_step"))
    sample_step = chosen if chosen is not None else (sample_steps[-1] if sample_steps else None)
    context = {
        "job": job,
        "charts": charts,
        "progress": progress,
        "percent": progress.percent,
        "evals": evals,
        "logs": selectors.job_logs(job=job),
        "sample_steps": sample_steps,
        "sample_step": sample_step,
        "samples": selectors.job_samples(job=job, step=sample_step) if sample_step is not None else [],
        "config_json": json.dumps(job.config, indent=1, sort_keys=True),
        "evaluate_url": _evaluate_url(job),
    }
    template = "training/job_detail.html"
    if request.htmx and request.GET.get("partial") == "live":
        template += "#live"
    return render(request, template, context)


def _evaluate_url(job) -> str:
    """The evaluation form, filled in for the job's candidate: its deployment and the
    held-out items of the set it trained on (when the set holds any)."""
    if job.result_version is None:
        return ""
    query = {"candidate": job.result_version.name}
    if job.deployment is not None:
        query["deployment"] = job.deployment.name
    if job.training_set is not None and job.training_set.evaluable:
        query["training_set"] = str(job.training_set_id)
    return f"{reverse('promotion:models')}?{urlencode(query)}#evaluate"


@login_required
@permission_required("training.change_trainingjob", raise_exception=True)
@require_POST
def job_cancel(request: HttpRequest, job_id: int) -> HttpResponse:
    job = selectors.training_job_get(job_id=job_id)
    if job is None:
        raise Http404("no such job")
    training_job_cancel(job=job, user=request.user)
    return redirect("training:job-detail", job_id=job.pk)


def _set_name_and_heldout(data, *, default_heldout: float) -> tuple[str, float, list[tuple[str, str]]]:
    """A training-set form's name and held-out share, with (field, reason) for each bad one."""
    errors: list[tuple[str, str]] = []
    name = (data.get("name") or "").strip()
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        errors.append(("name", "use letters, digits, - and _"))
    try:
        heldout = float(data.get("heldout_fraction") or default_heldout)
    except ValueError:
        heldout = -1.0
    if not 0 <= heldout < 1:
        errors.append(("heldout_fraction", "must be a number from 0 up to (not including) 1, e.g. 0.2"))
    return name, heldout, errors


@login_required
@permission_required("training.add_trainingset", raise_exception=True)
@require_POST
def training_set_build(request: HttpRequest) -> HttpResponse:
    """Build a training set from the trace list's filters (its query string) or a queue."""
    data = request.POST
    name, heldout, errors = _set_name_and_heldout(data, default_heldout=0.2)
    queue = data.get("queue") or ""
    query = (data.get("filters") or "").strip().lstrip("?")
    if "?" in query:  # a whole trace-list URL was pasted
        query = query.split("?", 1)[1]
    filters, queue_id = None, None
    if not queue:
        form = TraceFilterForm(_deployment_by_name(QueryDict(query, mutable=True)))
        filters = form.filters()
        errors += [(f"filters.{field}", "; ".join(msgs)) for field, msgs in form.errors.items()]
    else:
        queue_id, wrong = form_id(data, "queue")
        if queue_id is None:
            errors += wrong or [("queue", "choose a queue")]
    built = None
    if not errors:
        try:
            built = training_set_from_feedback(
                name=name,
                filters=filters,
                queue_id=queue_id,
                heldout_fraction=heldout,
                user=request.user,
                judge_gate_override_reason=data.get("judge_gate_override_reason") or "",
            )
        except TrainingSetError as exc:
            errors = exc.errors
    if built is not None:
        _built_message(request, built)
        return redirect(f"{reverse('training:job-list')}?built={built.pk}#sets")
    set_problems = problems(errors, labels=SET_LABELS, prefix="set")
    return _job_list_page(request, status=400, set_errors=set_problems, set_form=data.dict())


def _deployment_by_name(query):
    """The trace list's filter takes a deployment's id; a name typed or pasted in its place
    means that deployment."""
    wanted = query.get("deployment") or ""
    if wanted and parse_id(wanted) is None:
        found = Deployment.objects.filter(name=wanted).values_list("pk", flat=True).first()
        if found is not None:
            query["deployment"] = str(found)
    return query


def _built_message(request: HttpRequest, built: TrainingSet) -> None:
    said = f"Built {built}: {built.train_count} train / {built.heldout_count} held out."
    if built.heldout_count:
        flash.success(request, said)
    else:
        flash.warning(
            request, f"{said} With nothing held out, no evaluation can use it: hold out a share of two or more items."
        )


@login_required
@permission_required("training.add_trainingset", raise_exception=True)
@require_POST
def training_set_build_episodes(request: HttpRequest) -> HttpResponse:
    """Build a training set from a deployment's logged, graded episodes of an environment."""
    data = request.POST
    name, heldout, errors = _set_name_and_heldout(data, default_heldout=0.15)
    deployment = Deployment.objects.filter(name=data.get("deployment") or "").first()
    if deployment is None:
        errors.append(("deployment", "choose a deployment"))
    environment = (data.get("environment") or "").strip()
    if environment not in _environments():
        errors.append(("environment", "choose a registered environment"))
    variants = 0
    try:
        variants = int(data.get("variants") or 0)
    except ValueError:
        errors.append(("variants", "must be a whole number"))
    built = None
    if not errors:
        try:
            built = training_set_from_episodes(
                deployment=deployment,
                environment=environment,
                name=name,
                heldout_fraction=heldout,
                first_turns=not data.get("skip_first_turns"),
                targets=bool(data.get("targets")),
                variants=variants,
                user=request.user,
            )
        except TrainingSetError as exc:
            errors = exc.errors
    if built is not None:
        _built_message(request, built)
        return redirect(f"{reverse('training:job-list')}?built={built.pk}#sets")
    episode_problems = problems(errors, labels=EPISODE_LABELS, prefix="episode")
    return _job_list_page(request, status=400, episode_errors=episode_problems, episode_form=data.dict())


def _environments() -> list[str]:
    return environment_names()


def _episode_choices() -> dict:
    return {"deployments": Deployment.objects.order_by("name")[:100], "environments": _environments()}


def _queues():
    return AnnotationQueue.objects.only("id", "name", "item_count")[:100]


VIEW_SETS = "training.view_trainingset"
BUILD_SETS = "training.add_trainingset"


@dashboard_view(VIEW_SETS)
def training_set_detail(request: HttpRequest, set_id: int) -> HttpResponse:
    """A training set: what it was built from (a failure mode links back to its cluster),
    its counts and its first items, and where to use it."""
    training_set = selectors.training_set_get(set_id=set_id)
    if training_set is None:
        raise Http404("no such training set")
    context = {
        "set": training_set,
        "items": selectors.training_set_items(training_set=training_set),
        "is_slice": training_set.selection.get("kind") == "failure_mode",
    }
    return render(request, "training/set_detail.html", context)


@require_POST
@dashboard_view(BUILD_SETS)
def failure_cluster_slice(request: HttpRequest, cluster_id: int) -> HttpResponse:
    """The failure-modes page's "Make an evaluation slice" button: the cluster's turns as a
    set of held-out items, opened; a second click opens the same set."""
    if not request.user.has_perm(BROWSE):
        raise PermissionDenied(f"your role does not include {BROWSE}")
    cluster = get_object_or_404(FailureCluster, pk=cluster_id)
    try:
        built, created = evaluation_slice_from_failure_cluster(cluster=cluster, user=request.user)
    except TrainingSetError as exc:
        return cluster_refused(request, cluster, exc.errors[0][1])
    if created:
        flash.success(request, f"Evaluation slice {built} holds {built.heldout_count} held-out turns.")
    else:
        flash.info(request, f"This failure mode's evaluation slice is {built}: here it is.")
    return go_to(request, reverse("training:set-detail", kwargs={"set_id": built.pk}))
