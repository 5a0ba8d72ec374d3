"""OpenAI-style error bodies that also carry the project's `detail`/`errors` fields."""

from __future__ import annotations

import orjson

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
