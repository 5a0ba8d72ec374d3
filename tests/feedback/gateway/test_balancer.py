"""The gateway's balancer against raw asyncio upstreams: the least-loaded healthy replica gets
the request, a replica that cannot be reached or hangs up unanswered is taken out and the
request goes to another, the probe puts it back only once it serves the version again, and
nothing that may have reached a model (an answer begun, a timeout) is ever sent twice."""

from __future__ import annotations

import asyncio
import concurrent.futures

import orjson
import pytest

from feedback.gateway.balancer import Balancer
from feedback.gateway.errors import GatewayError
from training.inference.client import InferenceBadAnswer, InferenceUnavailable
from training.inference.server import free_port

MODEL = "support-v2"


class Upstream:
    """A replica speaking just enough HTTP/1.1. `behaviour` for completions: `ok` (answers
    with its name), `slow` (answers after `delay`), `hangs_up` (closes unanswered), `cut`
    (sends the status line and part of the body, then closes), `silent` (never answers),
    `missing` (vLLM's 404 for a model it does not serve). `models` is what /v1/models lists."""

    def __init__(self, name: str, *, behaviour: str = "ok", models: tuple[str, ...] = (MODEL,), port: int = 0):
        self.name, self.behaviour, self.models, self.port = name, behaviour, list(models), port
        self.delay = 0.3
        self.completions = 0  # completion requests received
        self.server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> Upstream:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        self.server.close()
        for writer in self._writers:
            writer.close()
        await self.server.wait_closed()

    async def _handle(self, reader, writer) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, path = head.split(b" ")[:2]
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                if method == b"GET" and path == b"/health":
                    self._send(writer, 200, b"")
                elif method == b"GET" and path == b"/v1/models":
                    self._send(writer, 200, orjson.dumps({"data": [{"id": m} for m in self.models]}))
                else:
                    self.completions += 1
                    if self.behaviour == "hangs_up":
                        writer.close()
                        return
                    if self.behaviour == "silent":
                        await asyncio.sleep(30)
                    if self.behaviour == "slow":
                        await asyncio.sleep(self.delay)
                    if self.behaviour == "cut":
                        writer.write(b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"id":')
                        await writer.drain()
                        writer.close()
                        return
                    if self.behaviour == "missing":
                        body = {"error": {"message": f"The model `{MODEL}` does not exist.", "param": "model"}}
                        self._send(writer, 404, orjson.dumps(body))
                    else:
                        self._send(writer, 200, orjson.dumps({"replica": self.name}))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()

    @staticmethod
    def _send(writer, status: int, body: bytes) -> None:
        writer.write(b"HTTP/1.1 %d X\r\ncontent-length: %d\r\n\r\n%s" % (status, len(body), body))


def run(coro):
    # In a thread of its own: the browser tests leave an event loop running in this one.
    with concurrent.futures.ThreadPoolExecutor(1) as executor:
        return executor.submit(asyncio.run, coro).result(timeout=60)


def balancer(**options) -> Balancer:
    return Balancer(api_key="k", read_timeout=options.pop("read_timeout", 5.0), probe_interval=0.05, **options)


async def call(b: Balancer, urls: list[str]) -> str:
    """One completion through the balancer; the name of the replica that answered."""
    replica, response = await b.send(urls, MODEL, "/v1/chat/completions", b"{}")
    try:
        return orjson.loads(await response.read())["replica"]
    finally:
        b.done(replica)


async def until(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def a_first(lb: Balancer) -> None:
    """The next scan starts at the first URL given (ties go to the first one scanned)."""
    lb._turn = -1


def test_ties_take_turns():
    async def scenario():
        a, b = await Upstream("a").start(), await Upstream("b").start()
        lb = balancer()
        try:
            return [await call(lb, [a.url, b.url]) for _ in range(6)]
        finally:
            lb.close()
            await a.stop()
            await b.stop()

    assert sorted(run(scenario())) == ["a"] * 3 + ["b"] * 3


def test_the_replica_with_fewest_requests_outstanding_gets_the_next():
    async def scenario():
        a, b = await Upstream("a", behaviour="slow").start(), await Upstream("b").start()
        a.delay = 1.0
        lb = balancer()
        try:
            urls = [a.url, b.url]
            a_first(lb)
            first = asyncio.create_task(call(lb, urls))
            await until(lambda: a.completions == 1)
            # Still on a, and a's turn again: the count decides, not the turn.
            a_first(lb)
            second = await call(lb, urls)
            outstanding = [r.outstanding for r in lb.replicas.values()]
            await first
            return second, outstanding, [r.outstanding for r in lb.replicas.values()]
        finally:
            lb.close()
            await a.stop()
            await b.stop()

    second, during, after = run(scenario())
    assert second == "b"
    assert during == [1, 0] and after == [0, 0]


def test_a_replica_that_cannot_be_reached_is_taken_out_the_request_served_elsewhere_and_it_comes_back():
    async def scenario():
        b = await Upstream("b").start()
        a = Upstream("a", models=(), port=free_port())  # not started: connection refused
        lb = balancer()
        try:
            urls = [a.url, b.url]
            answers = [await call(lb, urls) for _ in range(4)]
            down = lb.replica(a.url)
            assert not down.healthy and "cannot connect" in down.down_reason
            # It starts, but without the version the calls ask for: while they keep coming
            # (served by b), the probe keeps it out until it serves that version.
            await a.start()
            meanwhile = []
            for _ in range(10):
                await asyncio.sleep(0.05)
                meanwhile.append(await call(lb, urls))
            still_out = not down.healthy and meanwhile == ["b"] * 10
            a.models = [MODEL]
            await until(lambda: down.healthy)
            back = [await call(lb, urls) for _ in range(4)]
            return answers, still_out, back
        finally:
            lb.close()
            await b.stop()
            if a.server is not None:
                await a.stop()

    answers, still_out, back = run(scenario())
    assert answers == ["b"] * 4
    assert still_out
    assert sorted(back) == ["a", "a", "b", "b"]


def test_a_request_the_replica_hung_up_on_unanswered_is_retried_once_on_another():
    async def scenario():
        a, b = await Upstream("a", behaviour="hangs_up").start(), await Upstream("b").start()
        lb = balancer()
        try:
            a_first(lb)
            answer = await call(lb, [a.url, b.url])
            return answer, a.completions, b.completions, lb.replica(a.url).healthy
        finally:
            lb.close()
            await a.stop()
            await b.stop()

    answer, seen_a, seen_b, a_healthy = run(scenario())
    assert (answer, seen_a, seen_b, a_healthy) == ("b", 1, 1, False)


@pytest.mark.parametrize("behaviour", ["cut", "silent"])
def test_a_request_whose_answer_began_or_timed_out_is_never_sent_to_another_replica(behaviour):
    async def scenario():
        a, b = await Upstream("a", behaviour=behaviour).start(), await Upstream("b").start()
        lb = balancer(read_timeout=0.3)
        try:
            a_first(lb)
            with pytest.raises((InferenceBadAnswer, InferenceUnavailable)) as caught:
                await call(lb, [a.url, b.url])
            return caught.value, a.completions, b.completions, lb.replica(a.url)
        finally:
            lb.close()
            await a.stop()
            await b.stop()

    error, seen_a, seen_b, replica = run(scenario())
    assert (seen_a, seen_b) == (1, 0)
    assert replica.outstanding == 0
    if behaviour == "silent":
        # A slow server is still a server: it stays in, and the agent gets the timeout.
        assert isinstance(error, InferenceUnavailable) and error.timed_out and replica.healthy
    else:
        assert type(error) is InferenceBadAnswer


def test_a_replica_without_the_version_passes_the_request_on_and_stays_in():
    async def scenario():
        a, b = await Upstream("a", behaviour="missing").start(), await Upstream("b").start()
        lb = balancer()
        try:
            answers = []
            for _ in range(3):
                a_first(lb)
                answers.append(await call(lb, [a.url, b.url]))
            return answers, a.completions, lb.replica(a.url).healthy
        finally:
            lb.close()
            await a.stop()
            await b.stop()

    answers, seen_a, a_healthy = run(scenario())
    assert answers == ["b"] * 3
    assert seen_a == 3 and a_healthy


def test_no_healthy_replica_is_a_503_in_the_gateways_error_format():
    async def scenario():
        urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
        lb = balancer()
        try:
            with pytest.raises(InferenceUnavailable):
                await call(lb, urls)  # both tried, both refused: the transport's own 503
            with pytest.raises(GatewayError) as caught:
                await call(lb, urls)
            return caught.value
        finally:
            lb.close()

    error = run(scenario())
    assert (error.status, error.code) == (503, "upstream_unavailable")
    body = orjson.loads(error.body())
    assert body["error"]["type"] == "service_unavailable"
    assert body["error"]["message"].startswith(f"no healthy inference server for {MODEL}: all 2 are out")
    assert body["errors"] == [{"field": "", "reason": body["error"]["message"]}]


def test_replicas_without_the_version_do_not_use_up_the_retry_one_that_serves_it_answers():
    # Two of three replicas restarted without the adapter: each answers its 404 at once, so
    # least-outstanding picks them first; the request must still reach the one that serves it.
    async def scenario():
        a, b = await Upstream("a", behaviour="missing").start(), await Upstream("b", behaviour="missing").start()
        c = await Upstream("c").start()
        lb = balancer()
        try:
            answers = []
            for _ in range(6):
                a_first(lb)
                answers.append(await call(lb, [a.url, b.url, c.url]))
            return answers, [r.outstanding for r in lb.replicas.values()]
        finally:
            lb.close()
            for upstream in (a, b, c):
                await upstream.stop()

    answers, outstanding = run(scenario())
    assert answers == ["c"] * 6
    assert outstanding == [0, 0, 0]


def test_the_version_missing_everywhere_is_the_servers_404_once_each():
    async def scenario():
        ups = [await Upstream(n, behaviour="missing").start() for n in "abc"]
        lb = balancer()
        try:
            replica, response = await lb.send([u.url for u in ups], MODEL, "/v1/chat/completions", b"{}")
            lb.done(replica)
            return response.status, [u.completions for u in ups], [r.outstanding for r in lb.replicas.values()]
        finally:
            lb.close()
            for upstream in ups:
                await upstream.stop()

    status, seen, outstanding = run(scenario())
    assert status == 404 and seen == [1, 1, 1] and outstanding == [0, 0, 0]


def test_a_probe_survives_an_answer_it_cannot_read_and_brings_the_replica_back_later():
    async def scenario():
        b = await Upstream("b").start()
        a = Upstream("a", port=free_port())  # refused at first: taken out
        lb = balancer()
        try:
            urls = [a.url, b.url]
            a_first(lb)
            assert await call(lb, urls) == "b"
            down = lb.replica(a.url)
            assert not down.healthy
            a.models = [["not", "a", "name"]]  # an id that is not a string: unhashable
            await a.start()
            for _ in range(5):
                await asyncio.sleep(0.05)
                await call(lb, urls)
            probe_alive = down.probe is not None and not down.probe.done()
            a.models = [MODEL]
            await until(lambda: down.healthy)
            return probe_alive
        finally:
            lb.close()
            await b.stop()
            if a.server is not None:
                await a.stop()

    assert run(scenario())
