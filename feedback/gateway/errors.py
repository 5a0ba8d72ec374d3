"""OpenAI-style error bodies that also carry the project's `detail`/`errors` fields."""

from __future__ import annotations

import orjson

from training.inference.client import InferenceError, InferenceUnavailable, error_detail

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout",
}


class GatewayError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> bytes:
        return error_body(self.status, self.message, param=self.param, code=self.code)

    def as_dict(self) -> dict:
        return {"status": self.status, "message": self.message, "param": self.param, "code": self.code}


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> bytes:
    return orjson.dumps(
        {
            "error": {"message": message, "type": TYPES.get(status, "api_error"), "param": param, "code": code},
            "detail": f"{param}: {message}" if param else message,
            "errors": [{"field": param or "", "reason": message}],
        }
    )


def upstream_status_error(status: int, content: bytes) -> GatewayError:
    """An upstream error as the client should see it: its own 4xx (a bad request stays the
    client's), 502 for an upstream failure, 503/504 as they are."""
    detail = error_detail(status, content)
    if 400 <= status < 500:
        return GatewayError(status, detail.message, param=detail.param, code=detail.code)
    if status in (503, 504):
        return GatewayError(status, f"upstream: {detail.message}", code="upstream_unavailable")
    return GatewayError(502, f"upstream error ({status}): {detail.message}", code="upstream_error")


def transport_error(exc: InferenceError) -> GatewayError:
    if isinstance(exc, InferenceUnavailable) and exc.timed_out:
        return GatewayError(504, "the inference server did not answer in time", code="upstream_timeout")
    if isinstance(exc, InferenceUnavailable):
        return GatewayError(503, "the inference server is unavailable", code="upstream_unavailable")
    return GatewayError(502, f"the inference server connection failed: {exc}", code="upstream_error")
