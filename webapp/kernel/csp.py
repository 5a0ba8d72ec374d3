"""The Content-Security-Policy every page of the site is sent with.

Trace content is escaped by the templates; the policy is a second wall: only the app's own
script files run, so a `<script>` that ever slipped through escaping would still not run.
Set at the root (`ContentSecurityPolicyMiddleware`), so no page can lack it; a view that
needs a different policy sets its own header, which is kept.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


def with_csp(response: HttpResponse) -> HttpResponse:
    response.headers.setdefault("Content-Security-Policy", CSP)
    return response


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return with_csp(self.get_response(request))
