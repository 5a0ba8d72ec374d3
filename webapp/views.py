from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect


def home(request: HttpRequest) -> HttpResponse:
    # Reviewers work through queues only; everyone else starts at the trace list.
    if request.user.is_authenticated and not request.user.has_perm("feedback.view_trace"):
        return redirect("feedback:queue-list")
    return redirect("feedback:trace-list")


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})
