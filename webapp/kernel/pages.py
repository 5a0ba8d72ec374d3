"""What every dashboard page shares, whichever app it belongs to: login, a role check, and a
strict Content-Security-Policy (webapp/kernel/csp.py; the site's middleware also sends it with
every other response), and where to go back to after a POST."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from urllib.parse import urlencode

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import resolve_url
from django.utils.http import url_has_allowed_host_and_scheme
from django_htmx.http import HttpResponseClientRedirect

from webapp.kernel.csp import with_csp


def dashboard_view(permission: str | None = None) -> Callable:
    """Login required, the permission when given (403 otherwise), and the CSP header."""

    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def inner(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if permission and not request.user.has_perm(permission):
                raise PermissionDenied(f"your role does not include {permission}")
            return with_csp(view(request, *args, **kwargs))

        guarded = login_required(inner)

        @wraps(view)
        def outer(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.htmx and not request.user.is_authenticated:
                # A fragment request after the session expired: send the whole page to login,
                # rather than swapping the login form into a corner of it.
                return HttpResponseClientRedirect(
                    f"{resolve_url(settings.LOGIN_URL)}?{urlencode({'next': request.path})}"
                )
            return guarded(request, *args, **kwargs)

        return outer

    return decorate


def safe_next(request: HttpRequest, default: str) -> str:
    """Where to go back to after a POST: the `next` field when it is a local URL."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        return target
    return default
