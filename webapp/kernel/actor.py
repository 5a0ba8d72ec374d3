"""Who is acting: the signed-in person of the request being served, for the records that
must say who made a change even when the code making it is not ours (the Django admin's
user and group forms write through the ORM; `training.services.accounts` listens to the
model signals and asks here).

`ActorMiddleware` sets it for each request (after authentication; read lazily, so an API
view's own authentication counts); `acting_as(user)` sets it for a command that acts for a
named person. Outside both there is no actor: a migration, the shell, a worker.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

_current: ContextVar[Any] = ContextVar("practicum_actor", default=None)


def current_actor():
    """The authenticated person acting now, or None."""
    value = _current.get()
    user = getattr(value, "user", value)  # a request, or a user given by `acting_as`
    return user if user is not None and getattr(user, "is_authenticated", False) else None


@contextmanager
def acting_as(user) -> Iterator[None]:
    token = _current.set(user)
    try:
        yield
    finally:
        _current.reset(token)


class ActorMiddleware:
    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response

    def __call__(self, request):
        token = _current.set(request)
        try:
            return self.get_response(request)
        finally:
            _current.reset(token)
