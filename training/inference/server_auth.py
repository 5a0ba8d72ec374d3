"""The inference server's key on every route but its health check: ASGI middleware that the
server process loads (vLLM's `--middleware training.inference.server_auth.KeyGuard`, added
by `ServerSpec.command`).

vLLM's own `--api-key` check guards only paths under `/v1`, `/v2`, `/inference` and
`/cohere`. The rest of its app takes no key: the SageMaker routes (`POST /adapters` and
`DELETE /adapters/{name}` load and unload the LoRA adapter behind a name, `POST /invocations`
answers completions), `/scale_elastic_ep`, `/tokenize`, `/metrics`, `/docs`… and any route a
later vLLM version adds. This middleware wraps the whole app instead, so what it does not
name stays closed: only `GET /health` (and `HEAD`) answers without
`Authorization: Bearer <key>`, which the supervisor, the gateway's probe and load balancers
call without one.

The key is the server's `VLLM_API_KEY` (the one vLLM's own check reads); a server started
without one refuses to start rather than serve open. Imports nothing but the standard
library: the server process loads it by import path, with neither Django nor the project's
settings.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The one route a caller without the key may reach, and how.
OPEN_ROUTES = frozenset({("GET", "/health"), ("HEAD", "/health")})
KEY_ENV = "VLLM_API_KEY"
IMPORT_PATH = "training.inference.server_auth.KeyGuard"

_REFUSAL = json.dumps({"error": {"message": "Unauthorized: this server needs its API key", "code": 401}}).encode()


def _digest(value: str | bytes) -> bytes:
    return hashlib.sha256(value.encode() if isinstance(value, str) else value).digest()


class KeyGuard:
    """Answers 401 to every HTTP request but `GET /health` that lacks the key (OPTIONS
    included: no browser is meant to talk to this server) and closes such a websocket
    before it is accepted (the client sees 403); lifespan events pass through."""

    def __init__(self, app: ASGIApp, key: str | None = None) -> None:
        key = os.environ.get(KEY_ENV, "") if key is None else key
        if not key:
            raise RuntimeError(f"{KEY_ENV} is empty: the inference server does not start without its key")
        self.app = app
        self._key_digest = _digest(key)

    def authorized(self, scope: Scope) -> bool:
        for name, value in scope.get("headers") or ():
            if name.lower() == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    return hmac.compare_digest(_digest(token.strip()), self._key_digest)
                return False
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        method = scope.get("method", "GET") if kind == "http" else "WEBSOCKET"
        if (method, path) in OPEN_ROUTES or self.authorized(scope):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(_REFUSAL)).encode()),
                    (b"www-authenticate", b"Bearer"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": _REFUSAL})
