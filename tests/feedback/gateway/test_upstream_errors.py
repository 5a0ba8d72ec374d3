"""The gateway's own transport fails in the inference client's words, and the agent gets the
status each stands for: 503 when the server cannot be reached, 504 when it does not answer
in time, 502 when it drops the connection."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket

import pytest

from feedback.gateway.app import _transport_error
from feedback.gateway.upstream import UpstreamPool
from training.inference.client import InferenceBadAnswer, InferenceError, InferenceUnavailable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
            port, server = _free_port(), None
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
    assert type(error) is kind
    if isinstance(error, InferenceUnavailable):
        assert error.timed_out == (behaviour == "silent")
    answer = _transport_error(error)
    assert (answer.status, answer.code) == (status, code)
