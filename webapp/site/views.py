from datetime import UTC, datetime, time

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from feedback.services.demo_runs import DemoRunError, demo_agent_run_enqueue
from training.charts import chart_spec
from training.serving.models import Deployment
from webapp.kernel.ids import parse_id
from webapp.kernel.pages import dashboard_view
from webapp.site.selectors import ROLLING, deployments_overview
from webapp.site.selectors_drift import live_drift
from webapp.site.selectors_story import STORY_DAYS, deployment_story, story_curve
from webapp.site.selectors_tour import tour_deployment, tour_get

DAYS_CHOICES = (14, 7, 30, 90)


def home(request: HttpRequest) -> HttpResponse:
    # Reviewers work through queues only; everyone else starts at the trace list.
    if request.user.is_authenticated and not request.user.has_perm("feedback.view_trace"):
        return redirect("feedback:queue-list")
    return redirect("feedback:trace-list")


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


@login_required
@permission_required("feedback.view_trace", raise_exception=True)
def tour(request: HttpRequest) -> HttpResponse:
    """The guided tour: the loop as a checklist, each step ticked from the database."""
    name = request.GET.get("deployment") or None
    deployment = tour_deployment(name=name)
    if name and deployment is None:
        raise Http404("no such deployment")
    tour = tour_get(deployment=deployment, demo_target=settings.DEMO_EPISODES)
    context = {
        "tour": tour,
        "can_run_agent": request.user.has_perm("training.add_trainingjob"),
        # More while a progressive release is under way: its candidate's share of them walks its steps.
        "episodes": tour.agent_episodes(settings.DEMO_AGENT_EPISODES),
    }
    template = "tour.html#steps" if request.htmx else "tour.html"
    return render(request, template, context)


@login_required
@require_POST
def tour_agent_run(request: HttpRequest, deployment: str) -> HttpResponse:
    """Queue a run of the demo agent on test tasks (never trained on), through the gateway."""
    if not request.user.has_perm("training.add_trainingjob"):
        raise PermissionDenied("running the agent needs the operator or admin role")
    target = Deployment.objects.filter(name=deployment).first()
    if target is None:
        raise Http404("no such deployment")
    episodes = request.POST.get("episodes") or str(settings.DEMO_AGENT_EPISODES)
    try:
        if parse_id(episodes) is None:
            raise DemoRunError([("episodes", "must be a whole number")])
        demo_agent_run_enqueue(deployment=target, split="test", episodes=parse_id(episodes))
    except DemoRunError as exc:
        for field, reason in exc.errors:
            messages.error(request, f"{field}: {reason}")
        return render(
            request,
            "tour.html",
            {"tour": tour_get(deployment=target), "can_run_agent": True, "episodes": episodes},
            status=400,
        )
    messages.success(request, f"The agent is working on {episodes} test tasks; its traces appear as they arrive.")
    return redirect(f"{reverse('tour')}?deployment={target.name}")


@dashboard_view("feedback.view_trace")
def overview(request: HttpRequest) -> HttpResponse:
    """Per deployment: traffic, feedback, failure modes, the live version, and success
    rate and reward per model version over time."""
    days = DAYS_CHOICES[0]
    if request.GET.get("days"):
        try:
            days = int(request.GET["days"])
        except ValueError:
            days = 0
        if days not in DAYS_CHOICES:
            return render(
                request,
                "overview.html",
                {"error": f"days: must be one of {', '.join(map(str, DAYS_CHOICES))}", "days_choices": DAYS_CHOICES},
                status=400,
            )
    split = (request.GET.get("split") or "").strip()[:50] or None
    overviews = deployments_overview(days=days, split=split)
    for o in overviews:
        o.drift = live_drift(deployment=o.deployment)
        o.drifting = [d for d in o.drift if d.flagged]
        o.charts = _overview_charts(o)
    return render(
        request,
        "overview.html",
        {"overviews": overviews, "days": days, "days_choices": DAYS_CHOICES, "split": split or ""},
    )


def _overview_charts(o) -> list[dict]:
    """A deployment's charts on the overview: its traces per day as bars over the window, and
    each version's rolling success rate on the compared split."""

    def start(day) -> float:
        return datetime.combine(day, time(0), tzinfo=UTC).timestamp()

    key = o.deployment.pk
    traffic = chart_spec(
        chart_id=f"chart-traffic-{key}",
        title=f"Traces per day ({o.traces_total} in {len(o.days)} days)",
        series=[{"label": "traces", "points": [(start(d), n) for d, n in zip(o.days, o.traces_per_day, strict=True)]}],
        x={"label": "day (UTC)", "kind": "day", "range": (start(o.days[0]) - 43_200, start(o.days[-1]) + 43_200)},
        y={"label": "traces", "format": "int"},
        kind="bars",
        height=140,
    )
    by_version: dict[str, list[tuple[float, float]]] = {}
    for p in o.curve:
        by_version.setdefault(p.version, []).append((p.index, p.rate))
    success = chart_spec(
        chart_id=f"chart-success-{key}",
        title=(
            f"Success rate per model version on {o.comparison.split} tasks "
            f"(rolling, last {ROLLING} graded episodes of each version)"
            if o.comparison
            else "Success rate per model version"
        ),
        series=[{"label": name, "points": pts} for name, pts in by_version.items()],
        x={"label": "graded episode", "kind": "index"},
        y={"label": "success", "format": "percent", "range": (0, 1)},
    )
    return [success, traffic]


@dashboard_view("feedback.view_trace")
def deployment_story_view(request: HttpRequest, deployment: str) -> HttpResponse:
    """One deployment over time: its versions newest first (when each went live, what it
    learned from, its evaluation, who asked and who approved) and its live traffic's success
    per day across the versions, with the version changes marked."""
    target = Deployment.objects.filter(name=deployment[:100]).first()
    if target is None:
        raise Http404("no such deployment")
    days = STORY_DAYS[0]
    if request.GET.get("days"):
        raw = request.GET["days"]
        days = int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 5 else 0
        if days not in STORY_DAYS:
            return render(
                request,
                "story.html",
                {
                    "deployment": target,
                    "error": f"days: must be one of {', '.join(map(str, STORY_DAYS))}",
                    "days_choices": STORY_DAYS,
                },
                status=400,
            )
    story = deployment_story(deployment=target, days=days)
    chart = story_curve(story)
    return render(
        request,
        "story.html",
        {"deployment": target, "story": story, "chart": chart, "days": days, "days_choices": STORY_DAYS},
    )
