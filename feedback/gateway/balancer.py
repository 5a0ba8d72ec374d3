"""Spreading the gateway's calls over a base model's inference replicas.

Per gateway process, in its event loop (no locks, no shared state between processes): each
replica has its keep-alive pool, a count of requests outstanding on it (sent and not yet
fully read or streamed), and whether it is taking traffic.

- **Choice**: the healthy replica with the fewest outstanding requests; ties go round-robin
  (the scan starts one place further each call).
- **Out**: a replica is taken out when a request to it cannot connect or when it closes the
  connection before any byte of its answer (killed, restarting). A timeout does not take it
  out (a slow server is still a server) and a 5xx answer is passed through: only a failed
  probe keeps a replica out.
- **Back**: a replica that is out is probed in the background, with backoff from
  `probe_interval` to `probe_max`: `GET /health` must answer 200, then `GET /v1/models` must
  list every version asked for since the previous probe (the calls it would have had), so a
  restarted replica comes back only once it serves the live adapters. Only names asked
  since the last round count: a version that went out of service meanwhile is not awaited.
- **Retry**: `send` tries a request that failed before the first byte of an answer once more,
  on another healthy replica. One that a replica answered "no such model" (404 on `model`:
  restarted, its adapters not loaded yet) did no work and costs no retry: it goes on to each
  other healthy replica in turn, since such a replica answers fast, has few requests
  outstanding and so is picked first again and again. Nothing else is
  repeated: once an answer has started (a stream, a status line) or a read timed out, the
  server may have done the work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson

from feedback.gateway.errors import GatewayError
from feedback.gateway.upstream import UpstreamClosed, UpstreamPool, UpstreamResponse
from training.inference.client import InferenceError, InferenceUnavailable, error_detail

logger = logging.getLogger(__name__)


@dataclass(eq=False, slots=True)
class Replica:
    url: str
    pool: UpstreamPool
    outstanding: int = 0
    healthy: bool = True
    down_reason: str = ""
    down_since: float = 0.0
    # While it is out: the version names asked for since its last probe; back once it serves them.
    wanted: set[str] = field(default_factory=set)
    probe: asyncio.Task | None = None
    sent: int = 0  # requests sent to it, for the benchmark and the logs


class Buffered:
    """An answer already read in full (a 404 looked at to decide whether to try elsewhere),
    with the reading interface of `UpstreamResponse`."""

    def __init__(self, status: int, content: bytes) -> None:
        self.status = status
        self.content = content

    async def read(self) -> bytes:
        return self.content

    async def iter_bytes(self):
        yield self.content

    def close(self) -> None:
        pass


def _retryable(exc: InferenceError) -> bool:
    """Failed before any byte of an answer, and not by a timeout: the server did no work we
    would repeat (it was not reached, or went away before answering)."""
    if isinstance(exc, InferenceUnavailable):
        return not exc.timed_out
    return isinstance(exc, UpstreamClosed)


def _model_missing(status: int, content: bytes) -> bool:
    """vLLM's answer to a model name it does not serve: 404 with `param: model`."""
    return status == 404 and error_detail(status, content).param == "model"


class Balancer:
    def __init__(
        self,
        *,
        api_key: str,
        read_timeout: float,
        connect_timeout: float = 5.0,
        probe_interval: float = 0.25,
        probe_max: float = 2.0,
        probe_timeout: float = 5.0,
    ) -> None:
        self.api_key = api_key
        self.read_timeout = read_timeout
        self.connect_timeout = connect_timeout
        self.probe_interval = probe_interval
        self.probe_max = probe_max
        self.probe_timeout = probe_timeout
        self.replicas: dict[str, Replica] = {}
        self._turn = 0

    def replica(self, url: str) -> Replica:
        replica = self.replicas.get(url)
        if replica is None:
            pool = UpstreamPool(
                url, read_timeout=self.read_timeout, connect_timeout=self.connect_timeout, api_key=self.api_key
            )
            replica = self.replicas[url] = Replica(url=url, pool=pool)
        return replica

    def pick(self, urls: Sequence[str], model: str, *, exclude: Sequence[Replica] = ()) -> Replica | None:
        """The healthy replica among `urls` with the fewest outstanding requests, or None.
        A replica that is out notes `model`: its probe waits until it serves it."""
        n = len(urls)
        if n == 1:  # the common case: one server, no scan
            replica = self.replica(urls[0])
            if not replica.healthy:
                replica.wanted.add(model)
                return None
            return None if replica in exclude else replica
        start = self._turn = (self._turn + 1) % n
        best = None
        for i in range(n):
            replica = self.replica(urls[(start + i) % n])
            if not replica.healthy:
                replica.wanted.add(model)
            elif replica not in exclude and (best is None or replica.outstanding < best.outstanding):
                best = replica
        return best

    async def send(
        self, urls: Sequence[str], model: str, path: str, payload: bytes
    ) -> tuple[Replica, UpstreamResponse | Buffered]:
        """POST `payload` to a replica; returns it (its `outstanding` counted: call `done`
        once the answer is read or dropped) and the answer, its status line and headers in.

        Raises the `InferenceError` of the last try, or a 503 `GatewayError` when no replica
        is healthy to begin with."""
        tried: list[Replica] = []
        failure: InferenceError | None = None
        missing: tuple[Replica, Buffered] | None = None
        # Each try excludes the replicas tried before, so this ends after len(urls) tries at
        # most; a second failure to reach one ends it at once.
        while True:
            replica = self.pick(urls, model, exclude=tried)
            if replica is None:
                break
            tried.append(replica)
            replica.outstanding += 1
            replica.sent += 1
            try:
                response = await replica.pool.request("POST", path, payload)
                if response.status == 404:
                    response = Buffered(404, await response.read())
            except InferenceError as exc:
                replica.outstanding -= 1
                if not _retryable(exc):
                    raise
                self.mark_down(replica, str(exc), model)
                if failure is not None:
                    raise
                failure = exc
                continue
            except BaseException:
                replica.outstanding -= 1
                raise
            if isinstance(response, Buffered) and len(urls) > 1 and _model_missing(404, response.content):
                # A replica that restarted and has not loaded the live adapters yet (its
                # supervisor does that once it is up): another replica may serve the name. It
                # stays in: the same replica serves the deployments whose versions it has.
                replica.outstanding -= 1
                missing = (replica, response)
                continue
            return replica, response
        if failure is not None:
            raise failure
        if missing is not None:
            missing[0].outstanding += 1
            return missing
        down = [self.replica(url) for url in urls]
        reasons = "; ".join(f"{r.url}: {r.down_reason}" for r in down)
        raise GatewayError(
            503,
            f"no healthy inference server for {model}: all {len(down)} are out ({reasons})",
            code="upstream_unavailable",
        )

    @staticmethod
    def done(replica: Replica) -> None:
        replica.outstanding -= 1

    def mark_down(self, replica: Replica, reason: str, model: str) -> None:
        """Take `replica` out of the rotation and probe it until it serves `model` again."""
        replica.wanted.add(model)
        if not replica.healthy:
            return
        replica.healthy = False
        replica.down_reason = reason[:300]
        replica.down_since = time.monotonic()
        logger.warning("inference replica %s taken out: %s", replica.url, replica.down_reason)
        replica.probe = asyncio.get_running_loop().create_task(self._probe(replica))

    async def _probe(self, replica: Replica) -> None:
        delay = self.probe_interval
        while True:
            await asyncio.sleep(delay)
            wanted, replica.wanted = replica.wanted, set()
            try:
                ready = await asyncio.wait_for(self._ready(replica, wanted), self.probe_timeout)
            except (InferenceError, TimeoutError):
                ready = False
            except Exception:
                # Whatever the server answered, the probe goes on: a probe that died would
                # keep the replica out for the life of the process.
                logger.exception("probing inference replica %s failed", replica.url)
                ready = False
            if ready:
                replica.healthy, replica.down_reason, replica.probe = True, "", None
                replica.wanted.clear()
                logger.warning(
                    "inference replica %s back after %.1f s", replica.url, time.monotonic() - replica.down_since
                )
                return
            delay = min(delay * 2, self.probe_max)

    async def _ready(self, replica: Replica, wanted: set[str]) -> bool:
        response = await replica.pool.request("GET", "/health")
        await response.read()
        if response.status != 200:
            return False
        if not wanted:
            return True
        response = await replica.pool.request("GET", "/v1/models")
        content = await response.read()
        if response.status != 200:
            return False
        try:
            served = {m.get("id") for m in orjson.loads(content).get("data") or [] if isinstance(m, dict)}
        except (orjson.JSONDecodeError, AttributeError):
            return False
        return wanted <= served

    def state(self) -> list[dict]:
        """Each replica's place in the rotation (for the gateway's health answer)."""
        return [
            {"url": r.url, "healthy": r.healthy, "outstanding": r.outstanding, "sent": r.sent, "reason": r.down_reason}
            for r in self.replicas.values()
        ]

    def close(self) -> None:
        for replica in self.replicas.values():
            if replica.probe is not None:
                replica.probe.cancel()
            replica.pool.close()
        self.replicas.clear()
