"""One error body for every API: `{"detail": summary, "errors": [{"field", "reason"}]}`.

A `webapp.kernel.errors.DomainError` raised anywhere under an API view is answered here with its
status and its (field, reason) pairs; API views do not catch them one by one."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, parsers
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from webapp.kernel.errors import DomainError, Invalid


def _flatten(detail: Any, prefix: str = "") -> list[dict[str, str]]:
    if isinstance(detail, dict):
        out = []
        for key, value in detail.items():
            name = prefix if key == "non_field_errors" else (f"{prefix}.{key}" if prefix else str(key))
            out.extend(_flatten(value, name))
        return out
    if isinstance(detail, list):
        if all(not isinstance(d, dict | list) for d in detail):
            return [{"field": prefix, "reason": str(d)} for d in detail]
        out = []
        for i, value in enumerate(detail):
            out.extend(_flatten(value, f"{prefix}[{i}]"))
        return out
    return [{"field": prefix, "reason": str(detail)}]


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        return Response(exc.as_body(), status=exc.status)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        errors = _flatten(exc.detail)
        summary = "; ".join(f"{e['field']}: {e['reason']}" if e["field"] else e["reason"] for e in errors)
        response.data = {"detail": summary or "invalid request", "errors": errors}
    elif isinstance(response.data, dict) and "detail" in response.data:
        response.data = {"detail": str(response.data["detail"])}
    return response


def error_response(status: int, field: str, reason: str) -> Response:
    return Response(
        {"detail": f"{field}: {reason}" if field else reason, "errors": [{"field": field, "reason": reason}]},
        status=status,
    )


def limit_param(params, *, default: int, maximum: int) -> int:
    """The `limit` query parameter, 1 to `maximum` (`default` when absent); anything else,
    an empty value too, is a 400 naming it."""
    raw = params.get("limit")
    try:
        limit = default if raw is None else int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= maximum:
        raise Invalid(f"a whole number from 1 to {maximum}", field="limit")
    return limit


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, with a body nested past the interpreter's recursion limit answered
    as the malformed body it is (400) instead of a RecursionError (500)."""

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deeply") from None
