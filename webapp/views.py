from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils.safestring import mark_safe

from feedback.views.common import dashboard_view
from training.charts import series_chart
from webapp.selectors import ROLLING, deployments_overview

DAYS_CHOICES = (14, 7, 30, 90)


def home(request: HttpRequest) -> HttpResponse:
    # Reviewers work through queues only; everyone else starts at the trace list.
    if request.user.is_authenticated and not request.user.has_perm("feedback.view_trace"):
        return redirect("feedback:queue-list")
    return redirect("feedback:trace-list")


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})


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
    overviews = deployments_overview(days=days)
    for o in overviews:
        by_version: dict[str, list[tuple[float, float]]] = {}
        for p in o.curve:
            by_version.setdefault(p.version, []).append((p.index, p.rate))
        # series_chart escapes every label; the rest is numbers.
        o.chart = mark_safe(
            series_chart(
                list(by_version.items()),
                title=f"success rate per model version (rolling, last {ROLLING} graded episodes of each version)",
                y_range=(0.0, 1.0),
            )
        )
    return render(request, "overview.html", {"overviews": overviews, "days": days, "days_choices": DAYS_CHOICES})
