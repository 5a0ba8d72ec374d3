"""API-key and live-version lookups for the gateway, cached in memory for a few seconds.

The database answers once per key (and per deployment) per TTL; every other request is a
dict lookup. A revoked key or a flipped live pointer takes effect within the TTL
(`PRACTICUM_GATEWAY_AUTH_CACHE_SECONDS`, `PRACTICUM_GATEWAY_LIVE_CACHE_SECONDS`). On
PostgreSQL a flip is also announced with NOTIFY (`live_version_set`); `LiveListener` drops
the cached route as it arrives, so the next request already goes to the new version.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connections

from feedback.gateway.errors import GatewayError
from feedback.models import ApiKeyScope
from feedback.services.api_keys import ApiKeyError, api_key_authenticate
from training.serving.selectors import base_model_replica_urls, canary_split_get, live_version_get
from training.serving.services import LIVE_CHANNEL

logger = logging.getLogger(__name__)

GATEWAY_SCOPE = ApiKeyScope.INGEST
MAX_ENTRIES = 10000


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: int
    deployment_id: int
    deployment_name: str
    scopes: frozenset[str]
    stitch: bool = True  # the deployment joins calls that name no trace into conversations


@dataclass(frozen=True, slots=True)
class Route:
    version_id: int
    version_name: str
    upstream_urls: tuple[str, ...]  # the base model's replicas, the first one first
    created: int
    # A progressive release's candidate and its share of conversations (`feedback.gateway.split`).
    canary: Route | None = None
    canary_share: float = 0.0
    rollout_id: int | None = None


class TTLCache:
    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._items: dict[Any, tuple[float, Any]] = {}

    def get(self, key: Any) -> tuple[bool, Any]:
        item = self._items.get(key)
        if item is None or item[0] < time.monotonic():
            return False, None
        return True, item[1]

    def put(self, key: Any, value: Any, ttl: float | None = None) -> None:
        if len(self._items) >= MAX_ENTRIES:
            self._items.clear()
        self._items[key] = (time.monotonic() + (self.ttl if ttl is None else ttl), value)

    def discard(self, key: Any) -> None:
        self._items.pop(key, None)

    def clear(self) -> None:
        self._items.clear()


class LiveListener:
    """LISTENs for live-pointer flips on its own PostgreSQL connection, in a thread, and
    calls `on_flip(deployment_id)` for each; `on_flip(None)` after every (re)connect, since
    flips made while it was not listening were missed. Reconnects until stopped."""

    def __init__(self, on_flip: Callable[[int | None], None], *, poll_s: float = 0.5) -> None:
        self.on_flip = on_flip
        self.poll_s = poll_s
        self.listening = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gateway-live-listener", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    @staticmethod
    def _conninfo() -> dict[str, Any]:
        db = connections["default"].settings_dict
        params = {"dbname": db["NAME"], "user": db.get("USER"), "password": db.get("PASSWORD")}
        params.update(host=db.get("HOST") or None, port=db.get("PORT") or None)
        return {k: v for k, v in params.items() if v}

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(**self._conninfo(), autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {LIVE_CHANNEL}")
                    self.on_flip(None)
                    self.listening.set()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=self.poll_s):
                            try:
                                self.on_flip(int(note.payload))
                            except ValueError:
                                self.on_flip(None)
            except psycopg.Error as exc:
                self.listening.clear()
                logger.warning("live-version listener lost its connection (%s); retrying", exc)
                self._stop.wait(1.0)
        self.listening.clear()


def _authenticate_sync(token: str) -> Principal | GatewayError:
    try:
        key = api_key_authenticate(token)
    except ApiKeyError as exc:
        return GatewayError(401, str(exc), code="invalid_api_key")
    return Principal(
        key_id=key.id,
        deployment_id=key.deployment_id,
        deployment_name=key.deployment.name,
        scopes=frozenset(key.scopes),
        stitch=key.deployment.stitch_conversations,
    )


def _route_sync(deployment_id: int) -> Route | None:
    version = live_version_get(deployment_id=deployment_id)
    if version is None:
        return None
    split = canary_split_get(deployment_id=deployment_id)
    canary = None
    if split is not None and split.version_id != version.id:
        canary = Route(
            version_id=split.version.id,
            version_name=split.version.name,
            upstream_urls=tuple(base_model_replica_urls(base=split.version.base_model)),
            created=int(split.version.created_at.timestamp()),
        )
    return Route(
        version_id=version.id,
        version_name=version.name,
        upstream_urls=tuple(base_model_replica_urls(base=version.base_model)),
        created=int(version.created_at.timestamp()),
        canary=canary,
        canary_share=split.share if canary is not None else 0.0,
        rollout_id=split.rollout_id if canary is not None else None,
    )


class Access:
    def __init__(self, *, auth_ttl: float, route_ttl: float) -> None:
        self.keys = TTLCache(auth_ttl)
        self.routes = TTLCache(route_ttl)
        self.listener: LiveListener | None = None
        # One thread owns the lookups' database connection (cache misses are rare), so
        # shutting down can close it.
        self._db = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-db")

    async def _in_db_thread(self, fn, arg):
        return await asyncio.get_running_loop().run_in_executor(self._db, fn, arg)

    async def in_db_thread(self, fn, **kwargs):
        """`fn(**kwargs)` on the thread that owns the gateway's database connection."""
        return await asyncio.get_running_loop().run_in_executor(self._db, functools.partial(fn, **kwargs))

    def _route_changed(self, deployment_id: int | None) -> None:
        if deployment_id is None:
            self.routes.clear()
        else:
            self.routes.discard(deployment_id)

    def listen(self) -> LiveListener:
        """Start dropping cached routes on NOTIFY (PostgreSQL only)."""
        if self.listener is None:
            self.listener = LiveListener(self._route_changed)
            self.listener.start()
        return self.listener

    def close(self) -> None:
        if self.listener is not None:
            self.listener.stop()
        self._db.submit(connections.close_all).result(timeout=10)
        self._db.shutdown(wait=True)

    async def principal(self, authorization: bytes | None) -> Principal:
        if not authorization:
            raise GatewayError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        scheme, _, token = authorization.decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise GatewayError(401, "the Authorization header must be 'Bearer <key>'", code="invalid_api_key")
        hit, result = self.keys.get(token)
        if not hit:
            result = await self._in_db_thread(_authenticate_sync, token)
            # Refusals are cached briefly too, so a client retrying a bad key does not hammer the database.
            self.keys.put(token, result, None if isinstance(result, Principal) else min(self.keys.ttl, 2.0))
        if isinstance(result, GatewayError):
            raise result
        if GATEWAY_SCOPE not in result.scopes:
            raise GatewayError(403, f"this API key lacks the '{GATEWAY_SCOPE}' scope", code="insufficient_scope")
        return result

    async def route(self, principal: Principal) -> Route:
        hit, route = self.routes.get(principal.deployment_id)
        if not hit:
            route = await self._in_db_thread(_route_sync, principal.deployment_id)
            self.routes.put(principal.deployment_id, route)
        if route is None:
            raise GatewayError(
                404,
                f"deployment {principal.deployment_name!r} has no live model version "
                "(manage.py prepare_model … --live-for, or manage.py set_live)",
                param="model",
                code="model_not_found",
            )
        return route
