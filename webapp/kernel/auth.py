"""HTTP Basic for people's own logins (scripts calling the promotion API), under the same
login throttling as the login form (django-axes): a locked username gets 429 saying so,
whatever password it sends."""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.authentication import BasicAuthentication


class ThrottledBasicAuthentication(BasicAuthentication):
    def authenticate_credentials(self, userid, password, request=None):
        try:
            return super().authenticate_credentials(userid, password, request)
        except exceptions.AuthenticationFailed:
            # django-axes marks the request it refused because of a lockout.
            if request is not None and getattr(request, "axes_locked_out", False):
                raise exceptions.Throttled(
                    detail="too many failed logins for this user: locked for a while "
                    "(an administrator can lift it with manage.py axes_reset_username)"
                ) from None
            raise
