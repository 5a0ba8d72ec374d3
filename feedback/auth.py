"""DRF authentication and permissions for deployment API keys."""

from __future__ import annotations

from dataclasses import dataclass

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission

from feedback.models import ApiKey, ApiKeyScope
from feedback.services.api_keys import ApiKeyError, api_key_authenticate


@dataclass(frozen=True)
class ApiKeyPrincipal:
    """What `request.user` is for a request made with an API key."""

    api_key: ApiKey

    is_authenticated = True
    is_staff = False

    @property
    def deployment(self):
        return self.api_key.deployment

    def has_scope(self, scope: str) -> bool:
        return scope in self.api_key.scopes


class ApiKeyAuthentication(BaseAuthentication):
    keyword = b"bearer"

    def authenticate(self, request):
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword:
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <key>'")
        try:
            key = api_key_authenticate(header[1].decode("latin-1"))
        except ApiKeyError as exc:
            raise exceptions.AuthenticationFailed(str(exc)) from exc
        return ApiKeyPrincipal(key), key

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="practicum"'


# What a logged-in person needs to use an endpoint of each scope (their role's permission).
SCOPE_PERMISSIONS = {
    ApiKeyScope.READ: "feedback.view_trace",
    ApiKeyScope.INGEST: "feedback.add_trace",
    ApiKeyScope.FEEDBACK: "feedback.add_customerfeedback",
}


def scope_required(scope: str) -> type[BasePermission]:
    """A permission class: API-key requests need `scope`; session users need to be staff
    or hold the Django permission their role gives for that scope (SCOPE_PERMISSIONS)."""

    class HasScope(BasePermission):
        message = f"this API key lacks the '{scope}' scope"

        def has_permission(self, request, view) -> bool:
            user = request.user
            if isinstance(user, ApiKeyPrincipal):
                return user.has_scope(scope)
            if not (user and user.is_authenticated):
                return False
            if user.is_staff:
                return True
            permission = SCOPE_PERMISSIONS.get(scope)
            if permission and user.has_perm(permission):
                return True
            self.message = f"your role does not allow this ({permission or scope})"
            return False

    HasScope.__name__ = f"HasScope_{scope}"
    return HasScope
