"""A lean keep-alive HTTP/1.1 client for the gateway's calls to the inference server.

httpx/httpcore spend most of their time in connection-pool bookkeeping (several hundred
microseconds a request, measured with bench/gateway.py); this pool is an asyncio Protocol
with httptools' C parser, which is what the latency budget allows. It speaks only what the
gateway needs: POST/GET with a body, Content-Length or chunked responses, keep-alive, a
connect timeout and a per-read timeout.

The transport is its own; the conventions are the one inference client's
(`training.inference.client`): the server named by its root URL, its key as a Bearer token,
and failures as `InferenceUnavailable` (cannot connect, or no answer in time: `timed_out`)
or `InferenceBadAnswer` (the connection dropped or the answer did not parse). `UpstreamClosed`
is the one bad answer that carried no byte of a response: the server went away before
answering (killed, restarting), so the balancer may send the request to another replica.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httptools

from training.inference.client import InferenceBadAnswer, InferenceUnavailable, auth_headers, server_root


class UpstreamClosed(InferenceBadAnswer):
    """The server closed the connection before sending any byte of its answer."""


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.chunks: deque[bytes] = deque()
        self.headers_done = False
        self.keep_alive = False
        self.complete = False
        self.received = False
        self.waiter: asyncio.Future | None = None

    # -- protocol callbacks
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.closed = True
            self.transport.close()
        self._wake()

    def connection_lost(self, exc) -> None:
        self.closed = True
        self._wake()

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        # Read here: once the message is complete the parser no longer says.
        self.keep_alive = self.parser.should_keep_alive()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self.waiter, timeout)
        except TimeoutError as exc:
            raise InferenceUnavailable("the inference server did not answer in time", timed_out=True) from exc
        finally:
            self.waiter = None


class UpstreamResponse:
    def __init__(self, pool: UpstreamPool, conn: _Connection) -> None:
        self._pool = pool
        self._conn = conn
        self.status = conn.status

    async def read(self) -> bytes:
        parts = []
        async for chunk in self.iter_bytes():
            parts.append(chunk)
        return b"".join(parts)

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        conn = self._conn
        try:
            while True:
                while conn.chunks:
                    yield conn.chunks.popleft()
                if conn.complete:
                    break
                if conn.closed:
                    raise InferenceBadAnswer("the inference server closed the connection mid-response")
                await conn.wait(self._pool.read_timeout)
        except BaseException:
            self.close()
            raise
        self.release()

    def release(self) -> None:
        """Hand a finished connection back for reuse (or close it if it cannot be reused)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.complete and not conn.closed and conn.keep_alive:
            conn._reset()
            self._pool._idle.append(conn)
        else:
            conn.transport.close()

    def close(self) -> None:
        """Drop the connection (a response abandoned half-way: the server stops generating)."""
        conn, self._conn = self._conn, None
        if conn is not None and conn.transport is not None:
            conn.closed = True
            conn.transport.close()


class UpstreamPool:
    def __init__(
        self, url: str, *, connect_timeout: float = 5.0, read_timeout: float = 600.0, api_key: str = ""
    ) -> None:
        parts = urlsplit(server_root(url))
        if parts.scheme != "http":
            raise ValueError(f"{url}: the inference server is reached over plain http on a private network")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: list[_Connection] = []
        self._host_header = f"{self.host}:{self.port}".encode()
        # The inference server's own key (it refuses /v1/... without it).
        self._auth = b"".join(
            b"%s: %s\r\n" % (k.lower().encode(), v.encode()) for k, v in auth_headers(api_key).items()
        )

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(_Connection, self.host, self.port), self.connect_timeout
            )
        except (OSError, TimeoutError) as exc:
            raise InferenceUnavailable(f"cannot connect to the inference server: {exc}") from exc
        return conn

    async def request(self, method: str, path: str, body: bytes = b"", content_type: bytes = b"application/json"):
        """Send a request; returns once the status line and headers are in."""
        head = b"%s %s HTTP/1.1\r\nhost: %s\r\n%scontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (
            method.encode(),
            (self.prefix + path).encode(),
            self._host_header,
            self._auth,
            content_type,
            len(body),
        )
        for attempt in (0, 1):
            reused = False
            conn = None
            while self._idle:
                candidate = self._idle.pop()
                if not candidate.closed:
                    conn, reused = candidate, True
                    break
            if conn is None:
                conn = await self._connect()
            conn.transport.write(head + body)
            try:
                while not conn.headers_done:
                    if conn.closed:
                        if conn.received:
                            raise InferenceBadAnswer("the inference server closed the connection mid-answer")
                        raise UpstreamClosed("the inference server closed the connection without answering")
                    await conn.wait(self.read_timeout)
            except (InferenceUnavailable, InferenceBadAnswer):
                conn.transport.close()
                # A kept-alive connection the server had already closed: nothing was processed,
                # so one retry on a fresh connection is safe. A timeout is not that: the
                # server may be generating, and a second copy would run the request twice.
                if reused and conn.closed and not conn.received and attempt == 0:
                    continue
                raise
            except BaseException:
                conn.transport.close()
                raise
            return UpstreamResponse(self, conn)
        raise AssertionError("unreachable")

    def close(self) -> None:
        for conn in self._idle:
            conn.transport.close()
        self._idle.clear()
