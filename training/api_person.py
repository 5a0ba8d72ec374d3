"""The base of the training app's APIs that act for a person: a logged-in session, or HTTP
Basic with the person's own login for scripts; deployment API keys are not accepted.

Shared by the promotion, jobs, training-set, learning-policy and policy-note APIs, so none of
them imports another's API module for it."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import PermissionDenied as ApiPermissionDenied
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.views import APIView

from webapp.kernel.auth import ThrottledBasicAuthentication

# What an API that names no permission of its own needs: to see promotion requests.
VIEW = "training.view_promotionrequest"


def needs(permission: str) -> type[BasePermission]:
    class HasPermission(BasePermission):
        message = f"your role does not include {permission}"

        def has_permission(self, request, view) -> bool:
            return bool(request.user and request.user.is_authenticated and request.user.has_perm(permission))

    HasPermission.__name__ = f"Has_{permission.replace('.', '_')}"
    return HasPermission


class PersonApi(APIView):
    authentication_classes = [SessionAuthentication, ThrottledBasicAuthentication]
    permission_classes = [IsAuthenticated, needs(VIEW)]

    def handle_exception(self, exc):
        if isinstance(exc, PermissionDenied):
            exc = ApiPermissionDenied(str(exc))
        return super().handle_exception(exc)
