"""How the OpenAPI schema (`/api/schema/`, for logged-in people and keys) describes the
project's own authentication classes."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyScheme(OpenApiAuthenticationExtension):
    target_class = "feedback.auth.ApiKeyAuthentication"
    name = "apiKey"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A deployment API key (`prk_…`), as `Authorization: Bearer <key>`.",
        }


class ThrottledBasicScheme(OpenApiAuthenticationExtension):
    target_class = "webapp.kernel.auth.ThrottledBasicAuthentication"
    name = "basicAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "basic", "description": "A person's own login (throttled)."}
