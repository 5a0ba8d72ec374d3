"""A bound on how many requests a web process runs through Django at once.

Under ASGI, Django runs each request's synchronous code (views, the ORM) in a thread of
its own, and each such thread holds its own database connection while it runs: with no
bound, a burst of clients opens as many connections as there are clients, past
PostgreSQL's `max_connections` ("sorry, too many clients already"). Here a request waits
for a slot in the event loop — costing neither a thread nor a connection — and at most
`limit` run at once, each borrowing one connection from the process's pool
(`DB_POOL_MAX_SIZE`). Waiting requests are served in arrival order; none is refused.

A slot is taken only once the request's body is in (`admit`, `webapp/site/request_bodies.py`):
a client that sends its headers and then nothing holds no slot while it waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

Asgi = Callable[[dict[str, Any], Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


def bounded(app: Asgi, *, limit: int, admit: Callable[..., Awaitable[Any]] | None = None) -> Asgi:
    """`app` with at most `limit` HTTP requests in it at a time (0: no bound).

    `admit(scope, receive, send, slot)` runs first, outside the bound: it returns the
    `receive` the app is to read from, or None when it has answered the request itself; it may
    hold `slot()` for short work that needs a database connection."""
    if limit <= 0 and admit is None:
        return app
    slots: asyncio.Semaphore | None = None

    @asynccontextmanager
    async def slot() -> AsyncIterator[None]:
        nonlocal slots
        if limit <= 0:
            yield
            return
        if slots is None:
            slots = asyncio.Semaphore(limit)
        async with slots:
            yield

    async def application(scope, receive, send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if admit is not None:
            receive = await admit(scope, receive, send, slot)
            if receive is None:
                return
        async with slot():
            await app(scope, receive, send)

    application.limit = limit  # type: ignore[attr-defined]
    return application
