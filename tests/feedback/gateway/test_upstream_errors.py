"""The gateway's own transport fails in the inference client's words, and the agent gets the
status each stands for: 503 when the server cannot be reached, 504 when it does not answer
in time, 502 when it drops the connection."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest

from feedback.gateway.errors import transport_error
from feedback.gateway.upstream import UpstreamClosed, UpstreamPool
from training.inference.client import InferenceBadAnswer, InferenceError, InferenceUnavailable
from training.inference.server import free_port


def _failure(behaviour: str) -> InferenceError:
    """The error a request raises against an upstream that `behaviour`s (`silent`: reads
    the request and never answers; `hangs_up`: closes the connection; `absent`: no server)."""

    async def run() -> InferenceError:
        async def handle(reader, writer):
            await reader.read(1000)
            if behaviour == "hangs_up":
                writer.close()
            else:
                await asyncio.sleep(5)

        if behaviour == "absent":
            port, server = free_port(), None
        else:
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
        pool = UpstreamPool(f"http://127.0.0.1:{port}/v1", read_timeout=0.3, connect_timeout=2, api_key="k")
        try:
            await pool.request("POST", "/v1/chat/completions", b"{}")
        except InferenceError as exc:
            return exc
        finally:
            pool.close()
            if server is not None:
                server.close()
        raise AssertionError("the request did not fail")

    # In a thread of its own: the browser tests leave an event loop running in this one.
    with concurrent.futures.ThreadPoolExecutor(1) as executor:
        return executor.submit(asyncio.run, run()).result(timeout=30)


@pytest.mark.parametrize(
    ("behaviour", "kind", "status", "code"),
    [
        ("absent", InferenceUnavailable, 503, "upstream_unavailable"),
        ("silent", InferenceUnavailable, 504, "upstream_timeout"),
        ("hangs_up", InferenceBadAnswer, 502, "upstream_error"),
    ],
)
def test_an_upstream_failure_is_the_clients_error_kind_and_the_agent_gets_its_status(behaviour, kind, status, code):
    error = _failure(behaviour)
    # A hang-up before any byte is the bad answer's `UpstreamClosed`, which the balancer may
    # send to another replica; with one server the agent's status is the same.
    assert isinstance(error, kind)
    assert (type(error) is UpstreamClosed) == (behaviour == "hangs_up")
    if isinstance(error, InferenceUnavailable):
        assert error.timed_out == (behaviour == "silent")
    answer = transport_error(error)
    assert (answer.status, answer.code) == (status, code)


def _requests_seen(second: str) -> tuple[int, InferenceError | None]:
    """How many requests the upstream received when a kept-alive connection, after one
    answered request, meets `second` (`silent`: the server works on it and never answers
    in time; `closed`: the server closes the connection unanswered, as when its idle timeout
    fires as the request arrives), and the error raised."""

    async def run() -> tuple[int, InferenceError | None]:
        seen = 0

        async def handle(reader, writer):
            nonlocal seen
            while await reader.readuntil(b"\r\n\r\n"):
                await reader.readexactly(2)  # the body: b"{}"
                seen += 1
                if seen == 2 and second == "silent":
                    await asyncio.sleep(5)
                if seen == 2 and second == "closed":  # the idle connection's close races the request
                    writer.close()
                    return
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = UpstreamPool(f"http://127.0.0.1:{port}/v1", read_timeout=0.5, connect_timeout=2)
        error = None
        try:
            await (await pool.request("POST", "/v1/chat/completions", b"{}")).read()
            try:
                await (await pool.request("POST", "/v1/chat/completions", b"{}")).read()
            except InferenceError as exc:
                error = exc
        finally:
            pool.close()
            server.close()
        return seen, error

    with concurrent.futures.ThreadPoolExecutor(1) as executor:
        return executor.submit(asyncio.run, run()).result(timeout=30)


def test_a_request_the_server_may_be_working_on_is_never_sent_twice():
    # A timeout on a kept-alive connection is not a stale connection: the server has the
    # request (a generation takes time), and a second copy would run it twice.
    seen, error = _requests_seen("silent")
    assert seen == 2 and isinstance(error, InferenceUnavailable) and error.timed_out


def test_a_connection_the_server_closed_while_idle_is_retried_on_a_fresh_one():
    seen, error = _requests_seen("closed")
    assert error is None and seen == 3
