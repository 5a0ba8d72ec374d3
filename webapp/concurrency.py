"""A bound on how many requests a web process runs through Django at once.

Under ASGI, Django runs each request's synchronous code (views, the ORM) in a thread of
its own, and each such thread holds its own database connection while it runs: with no
bound, a burst of clients opens as many connections as there are clients, past
PostgreSQL's `max_connections` ("sorry, too many clients already"). Here a request waits
for a slot in the event loop — costing neither a thread nor a connection — and at most
`limit` run at once, each borrowing one connection from the process's pool
(`DB_POOL_MAX_SIZE`). Waiting requests are served in arrival order; none is refused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

Asgi = Callable[[dict[str, Any], Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


def bounded(app: Asgi, *, limit: int) -> Asgi:
    """`app` with at most `limit` HTTP requests in it at a time (0: no bound)."""
    if limit <= 0:
        return app
    slots: asyncio.Semaphore | None = None

    async def application(scope, receive, send) -> None:
        nonlocal slots
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if slots is None:
            slots = asyncio.Semaphore(limit)
        async with slots:
            await app(scope, receive, send)

    application.limit = limit  # type: ignore[attr-defined]
    return application
