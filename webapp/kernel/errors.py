"""The domain's error types: one hierarchy, translated to HTTP in one place.

A service raises a `DomainError` subclass naming the field and the reason; it knows nothing of
HTTP beyond the status class attribute each kind carries. The DRF exception handler
(`webapp.kernel.api_errors.exception_handler`) turns any of them into the one error body
`{"detail": summary, "errors": [{"field", "reason"}]}` with that status, so an API view lets
them propagate instead of catching each by hand. Plain Python: nothing here imports Django.
"""

from __future__ import annotations


class DomainError(Exception):
    """A request the domain refuses. `errors` is a list of (field, reason) pairs; the empty
    field means the request as a whole."""

    status: int = 400
    field: str = ""
    code: str = ""

    def __init__(
        self,
        reason: str = "",
        *,
        field: str | None = None,
        code: str | None = None,
        errors: list[tuple[str, str]] | None = None,
    ) -> None:
        """`reason` alone names the class's `field`; `errors` gives several (field, reason)
        pairs at once (then `field` is the first one's)."""
        super().__init__(reason)
        if errors is not None and field is None and errors:
            field = errors[0][0]
        if field is not None:
            self.field = field
        if code is not None:
            self.code = code
        self.reason = reason
        self.errors: list[tuple[str, str]] = list(errors) if errors is not None else [(self.field, reason)]

    @property
    def detail(self) -> str:
        return "; ".join(f"{f}: {r}" if f else r for f, r in self.errors)

    def as_body(self) -> dict:
        return {"detail": self.detail, "errors": [{"field": f, "reason": r} for f, r in self.errors]}


class Invalid(DomainError):
    """The input is malformed or out of range (400)."""

    status = 400


class Refused(DomainError):
    """The caller may not do this (403)."""

    status = 403


class NotFound(DomainError):
    """What the request names does not exist, or not for this caller (404)."""

    status = 404


class Conflict(DomainError):
    """The request clashes with the current state (409)."""

    status = 409
