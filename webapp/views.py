from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect


def home(request: HttpRequest) -> HttpResponse:
    return redirect("feedback:trace-list")


def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"ok": True})
