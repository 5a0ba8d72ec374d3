"""Request bodies are read before a request takes a slot of the web process, and only once
they may be: within the route's size limit and from someone the route accepts.

For every request that declares a body (a Content-Length above 0, or chunked):

1. The route's limit (`body_limit`): a Content-Length over it is answered 413 at once, with
   none of the body read.
2. Who sends it: a route open to anonymous clients (the login form, feedback links) takes a
   small body from anyone; every other route needs an API key, a logged-in session or HTTP
   Basic credentials that are valid now, checked from the headers alone — a short database
   lookup inside one of the process's slots — or the request is answered (401 for the API,
   the login page for a page) with none of the body read.
3. The body is read with a deadline (`WEB_BODY_TIMEOUT_SECONDS` from the end of the
   headers), counted as it streams (a chunked body is cut off with 413 as it passes the
   limit), into a spooled temporary file as Django would, holding no slot: a client that
   sends its headers and then waits costs a connection, never a slot, and is answered 408.

Then the request waits for a slot (`webapp/site/concurrency.py`) and Django handles it with the
body already read (`ReadAheadASGIHandler`). Refusals close the connection, so the rest of a
refused body goes nowhere.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from http.cookies import CookieError, SimpleCookie
from importlib import import_module
from typing import Any
from urllib.parse import quote

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import authenticate, get_user
from django.core.exceptions import PermissionDenied
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections
from django.http import HttpRequest
from django.shortcuts import resolve_url
from django.urls import Resolver404, resolve

from feedback.services.api_keys import ApiKeyError, api_key_authenticate

# Views anyone may post to: the login and logout forms (the site's and the admin's) and the
# customer feedback links, whose signed token is the credential.
ANONYMOUS_VIEWS = frozenset(
    {"login", "logout", "admin:login", "admin:logout", "feedback:feedback-link", "api-feedback-link-post"}
)
# Room for a multipart upload's boundaries and its other fields, beside the file itself.
MULTIPART_ALLOWANCE = 64 * 1024

Slot = Callable[[], AbstractAsyncContextManager[None]]


class ReadAheadASGIHandler(ASGIHandler):
    """Django's ASGI handler, taking the body `body_gate` has already read when there is one."""

    async def read_body(self, receive):
        body = getattr(receive, "body_file", None)
        if body is not None:
            return body
        return await super().read_body(receive)


class _AfterBody:
    """The connection's `receive`, once its body has been read into `body_file`: Django
    takes the body from here and still hears the client disconnect through it."""

    def __init__(self, receive, body_file) -> None:
        self._receive = receive
        self.body_file = body_file

    async def __call__(self) -> dict[str, Any]:
        return await self._receive()


def _view_name(path: str) -> str:
    try:
        return resolve(path).view_name
    except Resolver404:
        return ""


def body_limit(view_name: str) -> int:
    """The most bytes a request body to this view may have."""
    if view_name in ANONYMOUS_VIEWS:
        return settings.WEB_ANONYMOUS_MAX_BODY_BYTES
    if view_name == "openai-files":  # fine-tuning uploads: the file and the multipart around it
        return max(settings.WEB_MAX_BODY_BYTES, settings.FINETUNE_FILE_MAX_BYTES + MULTIPART_ALLOWANCE)
    return settings.WEB_MAX_BODY_BYTES


def _headers(scope) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        out.setdefault(name.lower(), value)
    return out


def credentials_check(headers: dict[bytes, bytes], client: tuple[str, int] | None) -> str:
    """ "" when the headers carry credentials that are valid now (an API key, a logged-in
    session, HTTP Basic), else why not. Runs in a thread (it reads the database); a wrong
    Basic password counts as a failed login (django-axes), as it would in the view."""
    try:
        return _credentials_check(headers, client)
    finally:
        close_old_connections()


def _credentials_check(headers: dict[bytes, bytes], client: tuple[str, int] | None) -> str:
    authorization = headers.get(b"authorization", b"").decode("latin-1").strip()
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer":
        try:
            api_key_authenticate(credentials)
        except ApiKeyError as exc:
            return str(exc)
        return ""
    request = HttpRequest()
    request.META["REMOTE_ADDR"] = client[0] if client else ""
    request.META["HTTP_USER_AGENT"] = headers.get(b"user-agent", b"").decode("latin-1")
    if scheme.lower() == "basic":
        try:
            username, _, password = base64.b64decode(credentials, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return "the Authorization header's Basic credentials are not base64 of user:password"
        try:
            user = authenticate(request, username=username, password=password)
        except PermissionDenied:
            user = None
            request.axes_locked_out = True
        if getattr(request, "axes_locked_out", False):  # django-axes marks the request it refused
            return "too many failed logins for this user: locked for a while"
        return "" if user is not None and user.is_active else "wrong username or password"
    if authorization:
        return "the Authorization header must be 'Bearer <key>' or Basic credentials"
    cookie = SimpleCookie()
    try:
        cookie.load(headers.get(b"cookie", b"").decode("latin-1"))
    except CookieError:
        return "log in first"
    morsel = cookie.get(settings.SESSION_COOKIE_NAME)
    if morsel is None:
        return "log in, or send an API key ('Authorization: Bearer <key>')"
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(morsel.value)
    user = get_user(request)
    return "" if user.is_authenticated and user.is_active else "your session has ended: log in again"


async def _answer(send, status: int, body: bytes, content_type: bytes, extra: list | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                # The rest of a body that is not read goes nowhere.
                (b"connection", b"close"),
                (b"cache-control", b"no-store"),
                (b"x-content-type-options", b"nosniff"),
                *(extra or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _refuse(scope, send, status: int, field: str, reason: str) -> None:
    """The API's error body (with OpenAI's error object under /api/openai/), or plain text."""
    path = scope["path"]
    extra = [(b"www-authenticate", b'Bearer realm="practicum"')] if status == 401 else []
    if path.startswith("/api/"):
        body: dict[str, Any] = {"detail": f"{field}: {reason}", "errors": [{"field": field, "reason": reason}]}
        if path.startswith("/api/openai/"):
            kind = {401: "authentication_error", 429: "rate_limit_error"}.get(status, "invalid_request_error")
            body["error"] = {"message": body["detail"], "type": kind, "param": field, "code": None}
        await _answer(send, status, json.dumps(body).encode(), b"application/json", extra)
    else:
        await _answer(send, status, f"{field}: {reason}\n".encode(), b"text/plain; charset=utf-8", extra)


async def _to_login(scope, send) -> None:
    target = f"{resolve_url(settings.LOGIN_URL)}?next={quote(scope['path'])}".encode()
    await _answer(send, 302, b"", b"text/plain; charset=utf-8", [(b"location", target)])


async def _chunks(receive) -> AsyncIterator[bytes | None]:
    """The body's chunks as they arrive; None if the client went away."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            yield None
            return
        yield message.get("body", b"")
        if not message.get("more_body"):
            return


async def body_read(receive, *, limit: int, timeout: float):
    """The whole body in a spooled temporary file, or the (status, reason) to refuse it with
    (413 past `limit`, 408 after `timeout` seconds), or None if the client went away."""
    # Handed on to Django, which closes it when the request ends.
    body = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b")  # noqa: SIM115
    size = 0
    try:
        async with asyncio.timeout(timeout):
            async for chunk in _chunks(receive):
                if chunk is None:
                    body.close()
                    return None
                size += len(chunk)
                if size > limit:
                    body.close()
                    return 413, f"over {limit} bytes; at most {limit} for this route"
                body.write(chunk)
    except TimeoutError:
        body.close()
        return 408, f"not received within {timeout:g} seconds (received {size} bytes)"
    body.seek(0)
    return body


def _declared_length(headers: dict[bytes, bytes]) -> int | None:
    """The Content-Length (None when the body is chunked); -1 when it is no number."""
    raw = headers.get(b"content-length")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return -1


def body_gate(*, timeout: float | None = None) -> Callable[..., Awaitable[Any]]:
    """The `admit` step of `webapp.site.concurrency.bounded`: checks, then reads, a request's body
    before the request takes its slot. Returns the `receive` Django is to use, or None when
    the request has been answered here."""

    async def admit(scope, receive, send, slot: Slot):
        headers = _headers(scope)
        declared = _declared_length(headers)
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        if not chunked and not declared:
            return receive  # no body: nothing to wait for
        if declared is not None and declared < 0:
            await _refuse(scope, send, 400, "Content-Length", "must be a whole number of bytes")
            return None
        view = _view_name(scope["path"][len(scope.get("root_path", "")) :] or "/")
        limit = body_limit(view)
        if declared is not None and declared > limit:
            await _refuse(scope, send, 413, "body", f"{declared} bytes; at most {limit} for this route")
            return None
        if view not in ANONYMOUS_VIEWS:
            async with slot():
                why = await sync_to_async(credentials_check, thread_sensitive=False)(headers, scope.get("client"))
            if why:
                if not scope["path"].startswith("/api/") and b"authorization" not in headers:
                    await _to_login(scope, send)
                else:
                    status = 429 if why.startswith("too many failed logins") else 401
                    await _refuse(scope, send, status, "Authorization", why)
                return None
        seconds = settings.WEB_BODY_TIMEOUT_SECONDS if timeout is None else timeout
        body = await body_read(receive, limit=limit, timeout=seconds)
        if body is None:
            return None
        if isinstance(body, tuple):
            await _refuse(scope, send, body[0], "body", body[1])
            return None
        return _AfterBody(receive, body)

    return admit
