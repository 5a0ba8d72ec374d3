"""The gateway's ASGI app. See the package docstring for the shape; this module is the hot path:
one JSON parse of the request, one of the response (to keep the serving data and return to
the client only what it asked for), no database access except on a cache miss (in a thread).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson
from django.conf import settings

from feedback.gateway.access import Access, Route
from feedback.gateway.balancer import Balancer
from feedback.gateway.errors import GatewayError, error_body, transport_error, upstream_status_error
from feedback.gateway.exchange import Exchange, ExchangeStatus
from feedback.gateway.pins import Pins, served_version_sync
from feedback.gateway.recorder import Recorder
from feedback.gateway.split import pin_first_answer, release_metadata, route_for_call
from feedback.gateway.wire import (
    SESSION_HEADER,
    TRACE_HEADER,
    chunk_stripped,
    client_identifier,
    exchange_trace_header,
    read_body,
    response_headers,
    response_stripped,
    send_json,
)
from feedback.services.capture import new_trace_key
from training.inference.client import InferenceError
from webapp.kernel.chat_format import FieldError, json_depth_check, parse_message, parse_tools

logger = logging.getLogger(__name__)

# Request fields kept with each logged turn: what produced the logged tokens and log-probs.
PARAM_KEYS = (
    "model",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "stream",
)

# Fields whose nesting is checked where they are parsed; every other one is checked as a whole.
_CHECKED_FIELDS = frozenset({"messages", "tools", "metadata"})


class GatewayApp:
    def __init__(
        self,
        *,
        recorder: Recorder | None = None,
        auth_ttl: float | None = None,
        route_ttl: float | None = None,
        upstream_timeout: float | None = None,
    ) -> None:
        self.recorder = recorder or Recorder(
            queue_size=settings.GATEWAY_LOG_QUEUE_SIZE,
            batch_size=settings.GATEWAY_LOG_BATCH_SIZE,
            spill_dir=settings.DATA_DIR / "gateway-spill",
        )
        self.access = Access(
            auth_ttl=settings.GATEWAY_AUTH_CACHE_SECONDS if auth_ttl is None else auth_ttl,
            route_ttl=settings.GATEWAY_LIVE_CACHE_SECONDS if route_ttl is None else route_ttl,
        )
        self.timeout = settings.GATEWAY_UPSTREAM_TIMEOUT if upstream_timeout is None else upstream_timeout
        self.max_body = settings.INGEST_MAX_BODY_BYTES
        self.body_timeout = settings.WEB_BODY_TIMEOUT_SECONDS
        # One per process: its replicas' outstanding counts and health are this process's view.
        self.balancer = Balancer(api_key=settings.INFERENCE_API_KEY, read_timeout=self.timeout)
        self.pins = Pins(ttl=settings.GATEWAY_PIN_SECONDS)

    async def startup(self) -> None:
        self.recorder.start()
        if settings.IS_POSTGRES and settings.GATEWAY_LIVE_LISTEN and self.access.routes.ttl > 0:
            self.access.listen()

    async def shutdown(self) -> None:
        self.balancer.close()
        await asyncio.to_thread(self.recorder.stop)
        await asyncio.to_thread(self.access.close)

    async def __call__(self, scope, receive, send) -> None:
        path, method = scope["path"], scope["method"]
        try:
            if path == "/v1/chat/completions":
                if method != "POST":
                    raise GatewayError(405, "use POST")
                await self.chat_completions(scope, receive, send)
            elif path == "/v1/models":
                if method != "GET":
                    raise GatewayError(405, "use GET")
                await self.models(scope, send)
            elif path == "/v1/health":
                if method != "GET":
                    raise GatewayError(405, "use GET")
                await self.health(send)
            else:
                raise GatewayError(
                    404, f"no route {path}; the gateway serves /v1/chat/completions, /v1/models and /v1/health"
                )
        except GatewayError as exc:
            # A body refused for its size or its lateness is not read on: the connection closes.
            close = [(b"connection", b"close")] if exc.status in (408, 413) else []
            await send_json(send, exc.status, exc.body(), [(b"content-type", b"application/json"), *close])

    @staticmethod
    def _header(scope, name: bytes) -> bytes | None:
        for key, value in scope["headers"]:
            if key == name:
                return value
        return None

    async def health(self, send) -> None:
        """The log writer's state (no key needed: it holds no trace data). 503 when the writer
        is not running or its queue is full, so a load balancer can take the process out."""
        report = self.recorder.health()
        await send_json(send, 200 if report["status"] == "ok" else 503, orjson.dumps({"recorder": report}))

    async def models(self, scope, send) -> None:
        principal = await self.access.principal(self._header(scope, b"authorization"))
        route = await self.access.route(principal)
        body = {
            "object": "list",
            "data": [
                {
                    "id": route.version_name,
                    "object": "model",
                    "created": route.created,
                    "owned_by": principal.deployment_name,
                }
            ],
        }
        await send_json(send, 200, orjson.dumps(body))

    async def chat_completions(self, scope, receive, send) -> None:
        t0 = time.perf_counter()
        started_at = time.time()
        authorization = trace_header = session_header = declared = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value
            elif key == b"content-length":
                declared = value
            elif key == TRACE_HEADER:
                trace_header = value
            elif key == SESSION_HEADER:
                session_header = value
        principal = await self.access.principal(authorization)
        request = self._parse(await read_body(receive, self.max_body, declared=declared, timeout=self.body_timeout))
        messages, tools = self._validate(request)
        metadata = self._metadata(request.pop("metadata", None))
        # Both identifiers are checked before the model is called: the trace id is echoed in a
        # response header, where a CR/LF or NUL would make the server drop the connection after
        # the model had answered (and the turn would be logged as if the client had it).
        if trace_header:
            trace_key = client_identifier(trace_header.decode("utf-8", "replace"), "X-Practicum-Trace-Id", 150)
        else:
            trace_key = client_identifier(metadata.get("trace_id"), "metadata.trace_id", 150)
        explicit = bool(trace_key)
        if session_header:
            session = client_identifier(session_header.decode("utf-8", "replace"), "X-Practicum-Session-Id", 200)
        else:
            session = client_identifier(metadata.get("session_id"), "metadata.session_id", 200, allow_empty=True)
        session = session or ""
        route = await self.access.route(principal)
        live_route = route
        route, canary, opening = await route_for_call(
            route,
            self.pins,
            deployment_id=principal.deployment_id,
            key_id=principal.key_id,
            session=session,
            trace_key=trace_key,
            messages=messages,
            served_before=lambda: self.access.in_db_thread(
                served_version_sync,
                deployment_id=principal.deployment_id,
                session=session,
                trace_key=trace_key,
                api_key_id=principal.key_id,
                messages=messages,
            ),
        )

        params = {k: request[k] for k in PARAM_KEYS if k in request}
        stream = bool(request.get("stream"))
        want_logprobs = bool(request.get("logprobs"))
        want_token_ids = bool(request.get("return_token_ids"))
        request["model"] = route.version_name
        # Always ask for what training needs; `_strip_*` gives the client only what it asked for.
        request["logprobs"] = True
        request["return_token_ids"] = True
        want_usage = True
        if stream:
            options = request.get("stream_options") or {}
            want_usage = bool(isinstance(options, dict) and options.get("include_usage"))
            request["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}

        exchange = Exchange(
            deployment_id=principal.deployment_id,
            trace_key=trace_key or new_trace_key(),
            explicit_trace=explicit,
            session_id=session[:200],
            requested_model=str(params.get("model") or ""),
            version_id=route.version_id,
            messages=messages,
            tools=tools,
            params=params,
            metadata=release_metadata(metadata, live_route, canary),
            started_at=started_at,
            latency_ms=0.0,
            api_key_id=principal.key_id,
            stitch=principal.stitch and not explicit,
        )
        payload = orjson.dumps(request)
        self.recorder.expect()
        try:
            if stream:
                await self._stream(
                    send, receive, route, payload, exchange, t0, want_logprobs, want_token_ids, want_usage
                )
            else:
                await self._complete(send, receive, route, payload, exchange, t0, want_logprobs, want_token_ids)
        finally:
            if not exchange.latency_ms:
                exchange.latency_ms = (time.perf_counter() - t0) * 1000
            if opening is not None and exchange.status == ExchangeStatus.OK:
                pin_first_answer(self.pins, deployment_id=principal.deployment_id, key=opening, exchange=exchange)
            self.recorder.submit(exchange, expected=True)

    @staticmethod
    def _parse(body: bytes) -> dict[str, Any]:
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise GatewayError(400, f"the body is not valid JSON ({exc})", param="body") from exc
        if not isinstance(request, dict):
            raise GatewayError(400, "the body must be a JSON object", param="body")
        return request

    @staticmethod
    def _metadata(value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise GatewayError(400, "must be an object", param="metadata")
        try:
            json_depth_check(value, "metadata")
        except FieldError as exc:
            raise GatewayError(400, exc.reason, param=exc.field) from exc
        return value

    @staticmethod
    def _validate(request: dict[str, Any]) -> tuple[list, list]:
        raw_messages = request.get("messages")
        if not isinstance(raw_messages, list) or not raw_messages:
            raise GatewayError(400, "required non-empty array of chat messages", param="messages")
        # The batch API's limit on messages per trace: the logged trace holds these and the answer.
        limit = settings.INGEST_MAX_MESSAGES_PER_TRACE
        if len(raw_messages) >= limit:
            raise GatewayError(
                400,
                f"{len(raw_messages)} messages; at most {limit - 1} per call "
                f"(a trace holds at most {limit} messages, the answer included: PRACTICUM_INGEST_MAX_MESSAGES)",
                param="messages",
                code="too_many_messages",
            )
        try:
            messages = [parse_message(m, f"messages[{i}]") for i, m in enumerate(raw_messages)]
            tools = parse_tools(request["tools"], "tools") if request.get("tools") is not None else []
            # Every other field too (`response_format`, `stop`, `tool_choice`, …): the logged
            # parameters are stored like the messages, and the request is re-encoded for the model.
            for key, value in request.items():
                if key not in _CHECKED_FIELDS:
                    json_depth_check(value, key)
        except FieldError as exc:
            raise GatewayError(400, exc.reason, param=exc.field) from exc
        if "stream" in request and not isinstance(request["stream"], bool):
            raise GatewayError(400, "must be true or false", param="stream")
        n = request.get("n", 1)
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128):
            raise GatewayError(400, "an integer from 1 to 128", param="n")
        return messages, tools

    def _fail(self, exchange: Exchange, error: GatewayError, t0: float, body: Any = None) -> None:
        exchange.status = ExchangeStatus.ERROR
        exchange.error = {**error.as_dict(), **({"upstream_body": body} if body is not None else {})}
        exchange.latency_ms = (time.perf_counter() - t0) * 1000

    async def _complete(
        self, send, receive, route: Route, payload, exchange, t0, want_logprobs, want_token_ids
    ) -> None:
        # The body is read, so the next message can only be the client leaving (an SDK's
        # timeout, before it retries): the answer then never reached it, and is logged as such.
        gone = asyncio.ensure_future(receive())
        try:
            await self._complete_call(send, gone, route, payload, exchange, t0, want_logprobs, want_token_ids)
        finally:
            if not gone.done():
                gone.cancel()

    async def _complete_call(
        self, send, gone, route: Route, payload, exchange, t0, want_logprobs, want_token_ids
    ) -> None:
        replica = None
        try:
            replica, response = await self.balancer.send(
                route.upstream_urls, route.version_name, "/v1/chat/completions", payload
            )
            content = await response.read()
        except InferenceError as exc:
            error = transport_error(exc)
            self._fail(exchange, error, t0)
            raise error from exc
        except GatewayError as error:
            self._fail(exchange, error, t0)
            raise
        finally:
            if replica is not None:
                self.balancer.done(replica)
        if response.status != 200:
            error = upstream_status_error(response.status, content)
            self._fail(exchange, error, t0, content[:2000].decode(errors="replace"))
            raise error
        try:
            body = orjson.loads(content)
        except orjson.JSONDecodeError as exc:
            error = GatewayError(502, "the inference server sent invalid JSON", code="upstream_error")
            self._fail(exchange, error, t0, content[:2000].decode(errors="replace"))
            raise error from exc
        exchange.response = body
        if gone.done() and not gone.cancelled() and gone.result().get("type") == "http.disconnect":
            exchange.status = ExchangeStatus.PARTIAL
            exchange.error = {"status": 499, "message": "the client disconnected before the answer was sent"}
            exchange.latency_ms = (time.perf_counter() - t0) * 1000
            return
        out = body if want_logprobs and want_token_ids else response_stripped(body, want_logprobs, want_token_ids)
        data = orjson.dumps(out)
        exchange.latency_ms = (time.perf_counter() - t0) * 1000
        await send_json(
            send, 200, data, response_headers(exchange_trace_header(exchange), route.version_name, b"application/json")
        )

    async def _stream(
        self, send, receive, route: Route, payload, exchange, t0, want_logprobs, want_token_ids, want_usage
    ) -> None:
        try:
            replica, response = await self.balancer.send(
                route.upstream_urls, route.version_name, "/v1/chat/completions", payload
            )
        except InferenceError as exc:
            error = transport_error(exc)
            self._fail(exchange, error, t0)
            raise error from exc
        except GatewayError as error:
            self._fail(exchange, error, t0)
            raise
        disconnected = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    disconnected.set()
                    return

        watcher = None
        try:
            if response.status != 200:
                try:
                    content = await response.read()
                except InferenceError:
                    content = b""
                error = upstream_status_error(response.status, content)
                self._fail(exchange, error, t0, content[:2000].decode(errors="replace"))
                raise error
            watcher = asyncio.create_task(watch())
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        *response_headers(exchange_trace_header(exchange), route.version_name, b"text/event-stream"),
                        (b"cache-control", b"no-cache"),
                    ],
                }
            )
            exchange.chunks = chunks = []
            strip = not (want_logprobs and want_token_ids and want_usage)
            buffer = b""
            try:
                async for data in response.iter_bytes():
                    buffer += data
                    out = []
                    while (end := buffer.find(b"\n\n")) >= 0:
                        event, buffer = buffer[:end], buffer[end + 2 :]
                        if not event.startswith(b"data: ") or event == b"data: [DONE]":
                            out.append(event + b"\n\n")
                            continue
                        chunk = orjson.loads(event[6:])
                        chunks.append(chunk)
                        if "error" in chunk:
                            exchange.status = ExchangeStatus.ERROR
                            exchange.error = {"status": 502, "message": str(chunk["error"])[:2000]}
                        if strip:
                            kept = chunk_stripped(chunk, want_logprobs, want_token_ids, want_usage)
                            if kept is not None:
                                out.append(b"data: " + orjson.dumps(kept) + b"\n\n")
                        else:
                            out.append(event + b"\n\n")
                    if disconnected.is_set():
                        exchange.status = ExchangeStatus.PARTIAL
                        break
                    if out:
                        await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
                        if exchange.ttft_ms is None:
                            exchange.ttft_ms = (time.perf_counter() - t0) * 1000
            except InferenceError as exc:
                # The upstream died mid-stream: tell the client in-band (the status line is sent).
                error = transport_error(exc)
                exchange.status = ExchangeStatus.ERROR
                exchange.error = {**error.as_dict(), "mid_stream": True}
                if not disconnected.is_set():
                    await send(
                        {
                            "type": "http.response.body",
                            "body": b"data: " + error_body(error.status, error.message, code=error.code) + b"\n\n",
                            "more_body": True,
                        }
                    )
            except OSError:
                exchange.status = ExchangeStatus.PARTIAL  # the client went away while we wrote to it
            exchange.latency_ms = (time.perf_counter() - t0) * 1000
            if exchange.status == ExchangeStatus.PARTIAL:
                exchange.error = {"status": 499, "message": "the client disconnected during the stream"}
            else:
                await send({"type": "http.response.body", "body": b""})
        finally:
            if watcher is not None:
                watcher.cancel()
            response.close()
            self.balancer.done(replica)


async def _lifespan(gateway: GatewayApp, receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await gateway.startup()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await gateway.shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return


def mount(django_app, gateway: GatewayApp | None = None):
    """The ASGI app of the whole site: `/v1/…` to the gateway, everything else to Django."""
    gateway = gateway or GatewayApp()

    async def application(scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http" and scope["path"].startswith("/v1/"):
            await gateway(scope, receive, send)
        elif kind == "lifespan":
            await _lifespan(gateway, receive, send)
        else:
            await django_app(scope, receive, send)

    application.gateway = gateway
    return application
