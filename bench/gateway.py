"""The completion gateway's own cost: the gateway vs calling the upstream directly.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/practicum .venv/bin/python bench/gateway.py

A fast deterministic upstream (an OpenAI-compatible stub written on raw asyncio, answering
a canned 16-token completion or SSE stream at once) stands in for vLLM, so the gateway's
own work dominates. The gateway runs as in production: uvicorn serving webapp.asgi with
every exchange logged to PostgreSQL. The same requests go to the gateway and straight to the
upstream, alternating one by one, from one client:

- non-streaming: p50 added latency (gateway p50 - direct p50, and the median paired gap);
- streaming: p50 added time to first token (first `data:` chunk);
- throughput: 16 concurrent clients, requests/s through the gateway (and direct, for scale),
  then the check that every exchange reached the database.

Uses its own database (<name>_gwbench), dropped and recreated each run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from support import fresh_database  # noqa: E402  (bench/, the script's own folder)

N_TOKENS = 16


# ---- the stub upstream -------------------------------------------------------------------------


def _completion(model: str) -> bytes:
    tokens = [{"token": f"t{i}", "logprob": -0.1 * i, "bytes": [116], "top_logprobs": []} for i in range(N_TOKENS)]
    return orjson.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": " ".join(f"t{i}" for i in range(N_TOKENS))},
                    "logprobs": {"content": tokens},
                    "finish_reason": "stop",
                    "token_ids": list(range(100, 100 + N_TOKENS)),
                }
            ],
            "usage": {"prompt_tokens": 20, "completion_tokens": N_TOKENS, "total_tokens": 20 + N_TOKENS},
        }
    )


def _sse(model: str) -> list[bytes]:
    def event(obj) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": model}
    events = [event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    for i in range(N_TOKENS):
        events.append(
            event(
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"content": f"t{i} "},
                            "logprobs": {"content": [{"token": f"t{i}", "logprob": -0.1, "top_logprobs": []}]},
                            "token_ids": [100 + i],
                            "finish_reason": "stop" if i == N_TOKENS - 1 else None,
                        }
                    ],
                }
            )
        )
    events.append(event({**base, "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": N_TOKENS}}))
    events.append(b"data: [DONE]\n\n")
    return events


class _StubProtocol(asyncio.Protocol):
    def __init__(self, body: bytes, sse: list[bytes]) -> None:
        import httptools

        self.parser = httptools.HttpRequestParser(self)
        self.body_json, self.sse = body, sse
        self.chunks: list[bytes] = []

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        body = b"".join(self.chunks)
        self.chunks = []
        if b'"stream":true' in body or b'"stream": true' in body:
            head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            first, rest = self.sse[0], b"".join(self.sse[1:])
            self.transport.write(head + b"%x\r\n%s\r\n" % (len(first), first))
            self.transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(rest), rest))
        else:
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(self.body_json), self.body_json)
            )


def serve_stub(port: int, model: str) -> None:
    import uvloop

    async def main() -> None:
        body, sse = _completion(model), _sse(model)
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _StubProtocol(body, sse), "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    uvloop.run(main())


# ---- setup -------------------------------------------------------------------------------------


def setup_database(base_url: str) -> str:
    return fresh_database(base_url, "_gwbench")


def create_deployment(db_url: str, upstream: str, model_dir: Path) -> str:
    os.environ["DATABASE_URL"] = db_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from feedback.services.api_keys import api_key_create
    from feedback.services.deployments import deployment_get_or_create
    from training.services.models import base_model_register, live_version_set

    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text("{}")  # the stub serves it; no weights are read
    dep = deployment_get_or_create(name="bench")
    _, version = base_model_register(name="bench-model", path=model_dir, inference_url=upstream)
    live_version_set(deployment=dep, version=version)
    return api_key_create(deployment=dep, scopes=["ingest"]).plaintext


def count_traces(db_url: str) -> int:
    import psycopg

    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT count(*) FROM feedback_trace").fetchone()[0]


def wait_port(port: int, timeout: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


# ---- measurements ------------------------------------------------------------------------------


def body(stream: bool, i: int) -> bytes:
    return orjson.dumps(
        {
            "model": "bench-model",
            "messages": [
                {"role": "system", "content": "You are a support agent."},
                {"role": "user", "content": f"Where is order {i}?"},
            ],
            "max_tokens": N_TOKENS,
            "temperature": 0,
            "stream": stream,
        }
    )


class RawClient:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams + httptools, so the load
    generator costs little of the 2 cores it shares with the gateway (httpx costs several
    times more per request)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, path: str, payload: bytes, headers: dict[str, str], stream: bool) -> float:
        import httptools

        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        head = f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {len(payload)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        state = {"done": False, "first": None, "status": 0, "body": []}
        t0 = time.perf_counter()

        class Handler:
            def on_body(self, chunk: bytes) -> None:
                if state["first"] is None and (not stream or b"data: " in chunk):
                    state["first"] = time.perf_counter() - t0
                state["body"].append(chunk)

            def on_message_complete(self) -> None:
                state["done"] = True

        parser = httptools.HttpResponseParser(Handler())
        self.writer.write(head.encode() + payload)
        while not state["done"]:
            data = await self.reader.read(65536)
            if not data:
                raise RuntimeError("connection closed")
            parser.feed_data(data)
        status = parser.get_status_code()
        if status != 200:
            raise RuntimeError(f"{status}: {b''.join(state['body'])[:300]!r}")
        return state["first"] if stream else time.perf_counter() - t0


GATEWAY_PATH = UPSTREAM_PATH = "/v1/chat/completions"


async def latency(gw_port: int, up_port: int, key: str, n: int, stream: bool) -> tuple[list[float], list[float]]:
    gw_t, up_t = [], []
    gw_headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    up_headers = {"content-type": "application/json"}
    gw, up = RawClient(gw_port), RawClient(up_port)
    for i in range(n + 20):
        payload = body(stream, i)
        a = await gw.request(GATEWAY_PATH, payload, gw_headers, stream)
        b = await up.request(UPSTREAM_PATH, payload, up_headers, stream)
        if i >= 20:  # warm-up: connections, caches
            gw_t.append(a)
            up_t.append(b)
    return gw_t, up_t


async def throughput(port: int, headers: dict, clients: int, seconds: float) -> tuple[int, float]:
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        nonlocal done
        client, i = RawClient(port), 0
        while time.perf_counter() < deadline:
            await client.request(GATEWAY_PATH, body(False, w * 1_000_000 + i), headers, False)
            done += 1
            i += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(clients)))
    return done, time.perf_counter() - t0


def ms(values: list[float], q: float = 0.5) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=500, help="alternating pairs per latency measurement")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10, help="length of each throughput run")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes for the gateway")
    parser.add_argument("--port", type=int, default=8150, help="gateway port; the stub upstream uses port+1")
    parser.add_argument("--stub", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stub:
        serve_stub(args.stub, "bench-model")
        return

    import uvloop

    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url.startswith("postgres"):
        sys.exit("bench/gateway.py needs DATABASE_URL=postgres://…")
    db_url = setup_database(base_url)
    up_port = args.port + 1
    upstream = f"http://127.0.0.1:{up_port}"
    key = create_deployment(db_url, upstream, ROOT / "var" / "bench-model")
    procs = [subprocess.Popen([sys.executable, __file__, "--stub", str(up_port)], cwd=ROOT)]
    procs.append(
        subprocess.Popen(
            [
                str(Path(sys.executable).parent / "uvicorn"),
                "webapp.asgi:application",
                "--port",
                str(args.port),
                "--workers",
                str(args.workers),
                "--loop",
                "uvloop",
                "--http",
                "httptools",
                "--log-level",
                "warning",
                "--no-access-log",
            ],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": db_url},
        )
    )
    gw, up = args.port, up_port
    try:
        wait_port(up_port)
        wait_port(args.port)
        print(
            f"{'':28} {'gateway p50':>12} {'direct p50':>11} {'added p50':>10} {'paired gap p50':>15} {'p90 added':>10}"
        )
        for stream, label in ((False, "non-streaming latency (ms)"), (True, "streaming TTFT (ms)")):
            gw_t, up_t = uvloop.run(latency(gw, up, key, args.requests, stream))
            gaps = [a - b for a, b in zip(gw_t, up_t, strict=True)]
            print(
                f"{label:28} {ms(gw_t):>12.3f} {ms(up_t):>11.3f} {ms(gw_t) - ms(up_t):>10.3f} "
                f"{ms(gaps):>15.3f} {ms(gw_t, 0.9) - ms(up_t, 0.9):>10.3f}"
            )
        # Everything the latency runs sent is written before the throughput run starts.
        before = 2 * (args.requests + 20)
        t0 = time.perf_counter()
        while count_traces(db_url) < before and time.perf_counter() - t0 < 60:
            time.sleep(0.2)
        headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
        n_gw, s_gw = uvloop.run(throughput(gw, headers, args.clients, args.seconds))
        n_up, s_up = uvloop.run(throughput(up, {"content-type": "application/json"}, args.clients, args.seconds))
        print(
            f"throughput, {args.clients} clients: gateway {n_gw / s_gw:.0f} req/s, direct {n_up / s_up:.0f} req/s "
            f"(ratio {n_gw / s_gw / (n_up / s_up):.2f})"
        )
        expected = before + n_gw
        t0 = time.perf_counter()
        while count_traces(db_url) < expected and time.perf_counter() - t0 < 60:
            time.sleep(0.2)
        logged = count_traces(db_url) - before
        print(
            f"logged: {logged}/{n_gw} exchanges of the throughput run in the database ({time.perf_counter() - t0:.1f} s after the last response)"
        )
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(15)


if __name__ == "__main__":
    main()
