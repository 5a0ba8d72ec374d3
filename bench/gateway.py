"""The completion gateway's own cost: the gateway vs calling the upstream directly.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/practicum .venv/bin/python bench/gateway.py

A fast deterministic upstream (an OpenAI-compatible stub written on raw asyncio, answering
a canned 16-token completion or SSE stream at once) stands in for vLLM, so the gateway's
own work dominates. The gateway runs as in production: uvicorn serving webapp.asgi with
every exchange logged to PostgreSQL. The same requests go to the gateway and straight to the
upstream, alternating one by one, from one client:

- non-streaming: p50 added latency (gateway p50 - direct p50, and the median paired gap),
  side by side for a deployment that stitches conversations and one that does not: the
  requests are turns of 8-turn conversations sent without a trace id, each resending the
  history, one request to each deployment and one direct, in turn;
- streaming: p50 added time to first token (first `data:` chunk);
- throughput: 16 concurrent clients, requests/s through the gateway (stitching off, then on;
  and direct, for scale), then the check that every exchange reached the database;
- stitching: the conversations the latency run sent, and the traces they became;
- the recorder alone, in this process: exchanges of 1,000 interleaved conversations
  submitted at 1,000/s (`--recorder-rate`) for `--recorder-seconds`, with stitching on, then
  off: the deepest its queue got, how long after the last one everything was written; then
  the same exchanges all at once: its own rate (`--recorder-only` runs just these). On and
  off alternate `--rounds` times (3), and the medians are printed.

`--split` measures only the added latency with a progressive release's split against none,
side by side (bench/gateway_split.py).

Uses its own database (<name>_gwbench), dropped and recreated each run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway_split import lookup_report, split_deployment, split_report, split_served  # noqa: E402  (bench/, the script's own folder)
from gateway_stub import N_TOKENS, _completion, serve_stub  # noqa: E402
from support import fresh_database  # noqa: E402

# ---- setup -------------------------------------------------------------------------------------


def setup_database(base_url: str) -> str:
    return fresh_database(base_url, "_gwbench")


def create_deployment(db_url: str, upstream: str, model_dir: Path) -> tuple[str, str]:
    os.environ["DATABASE_URL"] = db_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from feedback.services.api_keys import api_key_create
    from training.serving.services import base_model_register, deployment_get_or_create, live_version_set

    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text("{}")  # the stub serves it; no weights are read
    dep = deployment_get_or_create(name="bench")
    plain = deployment_get_or_create(name="bench-unstitched")
    plain.stitch_conversations = False
    plain.save(update_fields=["stitch_conversations"])
    _, version = base_model_register(name="bench-model", path=model_dir, inference_url=upstream)
    live_version_set(deployment=dep, version=version)
    live_version_set(deployment=plain, version=version)
    return (
        api_key_create(deployment=dep, scopes=["ingest"]).plaintext,
        api_key_create(deployment=plain, scopes=["ingest"]).plaintext,
    )


def count_traces(db_url: str, deployment: str | None = None) -> int:
    import psycopg

    with psycopg.connect(db_url) as conn:
        if deployment is None:
            return conn.execute("SELECT count(*) FROM feedback_trace").fetchone()[0]
        return conn.execute(
            "SELECT count(*) FROM feedback_trace t JOIN feedback_deployment d ON d.id = t.deployment_id"
            " WHERE d.name = %s",
            [deployment],
        ).fetchone()[0]


def count_messages(db_url: str) -> int:
    import psycopg

    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT count(*) FROM feedback_message").fetchone()[0]


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


TURNS = 8  # calls per conversation in the latency and throughput runs
ANSWER = " ".join(f"t{i}" for i in range(N_TOKENS))  # what the stub answers
ANSWER_STREAMED = "".join(f"t{i} " for i in range(N_TOKENS))  # and streams


def body(stream: bool, i: int, *, conversation: str | None = None) -> bytes:
    """Call `i % TURNS` of conversation `conversation or i // TURNS`: the whole history so far
    (the stub's earlier answers included), as a harness resends it, and no trace id."""
    name, turn = conversation or str(i // TURNS), i % TURNS
    messages = [{"role": "system", "content": "You are a support agent."}]
    for t in range(turn + 1):
        messages.append({"role": "user", "content": f"Conversation {name}: where is order {t}?"})
        if t < turn:
            messages.append({"role": "assistant", "content": ANSWER_STREAMED if stream else ANSWER})
    return orjson.dumps(
        {"model": "bench-model", "messages": messages, "max_tokens": N_TOKENS, "temperature": 0, "stream": stream}
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


async def latency(targets: list[tuple[str, int, dict[str, str]]], n: int, stream: bool) -> dict[str, list[float]]:
    """`n` rounds (after 20 to warm up); each round sends call i to every target in turn."""
    times: dict[str, list[float]] = {label: [] for label, _, _ in targets}
    clients = {label: RawClient(port) for label, port, _ in targets}
    for i in range(n + 20):
        for label, _, headers in targets:
            t = await clients[label].request(
                GATEWAY_PATH,
                body(stream, i, conversation=f"{label}-{'s' if stream else 'n'}{i // TURNS}"),
                headers,
                stream,
            )
            if i >= 20:  # warm-up: connections, caches
                times[label].append(t)
    return times


async def throughput(port: int, headers: dict, clients: int, seconds: float) -> tuple[int, float, list[int]]:
    calls = [0] * clients
    deadline = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        client = RawClient(port)
        while time.perf_counter() < deadline:
            i = calls[w]
            await client.request(GATEWAY_PATH, body(False, i, conversation=f"load-{w}-{i // TURNS}"), headers, False)
            calls[w] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(clients)))
    return sum(calls), time.perf_counter() - t0, calls


def recorder_idle(port: int, timeout: float = 120) -> float:
    """Wait until the gateway's log writer has written everything (GET /v1/health); seconds waited."""
    import urllib.request

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health") as answer:
            report = orjson.loads(answer.read())["recorder"]
        if report["queue_depth"] == 0 and report["in_flight"] == 0:
            return time.perf_counter() - t0
        time.sleep(0.1)
    raise RuntimeError("the gateway's recorder did not catch up")


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
    parser.add_argument("--recorder-rate", type=int, default=1000, help="exchanges/s fed to the recorder alone")
    parser.add_argument("--recorder-seconds", type=float, default=10)
    parser.add_argument("--recorder-only", action="store_true", help="skip the gateway runs")
    parser.add_argument("--rounds", type=int, default=3, help="recorder runs per setting, alternating")
    parser.add_argument("--split", action="store_true", help="only the added latency with a split vs without")
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
    key, plain_key = create_deployment(db_url, upstream, ROOT / "var" / "bench-model")
    split_key = split_deployment(ROOT / "var" / "bench-model") if args.split else ""
    if args.recorder_only:
        recorder_runs(args)
        return
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
    json_headers = {"content-type": "application/json"}
    stitched = {"authorization": f"Bearer {key}", **json_headers}
    unstitched = {"authorization": f"Bearer {plain_key}", **json_headers}
    try:
        wait_port(up_port)
        wait_port(args.port)
        print(f"{'':34} {'p50':>8} {'p90':>8} {'added p50':>10} {'paired gap p50':>15}")
        if args.split:
            split = {"authorization": f"Bearer {split_key}", **json_headers}
            print("non-streaming latency (ms), a progressive release's split vs none")
            targets = [("split", gw, split), ("plain", gw, stitched), ("direct", up, json_headers)]
            split_report(uvloop.run(latency(targets, args.requests, False)), ms)
            recorder_idle(gw)
            print(f"  the split deployment's conversations, by the version that served them: {split_served(db_url)}")
            lookup_report(lambda i: orjson.loads(body(False, i, conversation=f"split-n{i // TURNS}"))["messages"], 200)
            return
        for stream, label in ((False, "non-streaming latency (ms)"), (True, "streaming TTFT (ms)")):
            print(label)
            times = uvloop.run(
                latency(
                    [("stitched", gw, stitched), ("unstitched", gw, unstitched), ("direct", up, json_headers)],
                    args.requests,
                    stream,
                )
            )
            direct = times["direct"]
            for name in ("stitched", "unstitched", "direct"):
                t = times[name]
                gaps = [a - b for a, b in zip(t, direct, strict=True)]
                print(f"  {name:32} {ms(t):>8.3f} {ms(t, 0.9):>8.3f} {ms(t) - ms(direct):>10.3f} {ms(gaps):>15.3f}")
            on, off = times["stitched"], times["unstitched"]
            pairs = [a - b for a, b in zip(on, off, strict=True)]
            print(
                f"  stitching on / off: p50 ratio {ms(on) / ms(off):.3f}, p50 difference {ms(on) - ms(off):+.3f} ms, "
                f"median paired difference {ms(pairs):+.3f} ms"
            )
        # Everything the latency runs sent is written before the throughput run starts.
        recorder_idle(gw)
        sent = 2 * (args.requests + 20)  # to each deployment
        conversations = -(-(args.requests + 20) // TURNS) * 2  # streaming and not, per deployment
        on_traces, off_traces = count_traces(db_url, "bench"), count_traces(db_url, "bench-unstitched")
        print(
            f"stitching: {sent} calls of {conversations} conversations, sent without a trace id, became "
            f"{on_traces} traces with stitching on, {off_traces} with it off"
        )
        n_off, s_off, _ = uvloop.run(throughput(gw, unstitched, args.clients, args.seconds))
        recorder_idle(gw)
        before = count_traces(db_url)
        n_gw, s_gw, per_client = uvloop.run(throughput(gw, stitched, args.clients, args.seconds))
        n_up, s_up, _ = uvloop.run(throughput(up, json_headers, args.clients, args.seconds))
        print(
            f"throughput, {args.clients} clients: gateway {n_gw / s_gw:.0f} req/s (stitching off: {n_off / s_off:.0f}), "
            f"direct {n_up / s_up:.0f} req/s (ratio {n_gw / s_gw / (n_up / s_up):.2f})"
        )
        waited = recorder_idle(gw)
        started = sum(-(-n // TURNS) for n in per_client)
        print(
            f"logged: the {n_gw} calls of the throughput run's {started} conversations are "
            f"{count_traces(db_url) - before} traces ({waited:.1f} s after the last response)"
        )
    finally:
        for p in reversed(procs):
            p.terminate()
            p.wait(15)
    recorder_runs(args)


def recorder_runs(args) -> None:
    """Stitching on and off alternate, `--rounds` times, so the machine's noise hits both."""
    lag: dict[bool, list[float]] = {True: [], False: []}
    rate: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.rounds):
        for stitch in (True, False):
            lag[stitch].append(recorder_run(rate=args.recorder_rate, seconds=args.recorder_seconds, stitch=stitch))
        for stitch in (False, True):
            rate[stitch].append(recorder_run(rate=0, seconds=args.recorder_seconds, stitch=stitch))
    for stitch in (True, False):
        print(
            f"recorder, stitching {'on' if stitch else 'off'}, median of {args.rounds}: all written "
            f"{statistics.median(lag[stitch]):.2f} s after the last call at {args.recorder_rate}/s; "
            f"{statistics.median(rate[stitch]):.0f} exchanges/s fed all at once"
        )


def _exchange(k: int, conversations: int, stitch: bool, deployment_id: int, version_id: int):
    from feedback.gateway.exchange import Exchange
    from webapp.kernel.chat_format import parse_message

    conv, turn = k % conversations, k // conversations
    raw = [{"role": "system", "content": "You are a support agent."}]
    for t in range(turn + 1):
        raw.append({"role": "user", "content": f"Recorder {stitch} conversation {conv}: where is order {t}?"})
        if t < turn:
            raw.append({"role": "assistant", "content": ANSWER})
    return Exchange(
        deployment_id=deployment_id,
        trace_key=f"gw-{uuid.uuid4().hex}",
        explicit_trace=False,
        session_id="",
        requested_model="bench-model",
        version_id=version_id,
        messages=[parse_message(m, "m") for m in raw],
        tools=[],
        params={"temperature": 0},
        metadata={},
        started_at=time.time(),
        latency_ms=5.0,
        response=orjson.loads(_completion("bench-model")),
        stitch=stitch,
    )


def recorder_run(*, rate: int, seconds: float, stitch: bool, conversations: int = 1000) -> float:
    """The gateway's recorder fed at `rate` exchanges/s (0: all at once): does it keep up?
    Returns the seconds it took after the last exchange (0: its exchanges/s)."""
    import tempfile

    from feedback.gateway.recorder import Recorder
    from feedback.models import Trace
    from training.serving.models import Deployment, ModelVersion

    dep = Deployment.objects.get(name="bench" if stitch else "bench-unstitched")
    version = ModelVersion.objects.get(name="bench-model")
    total = int((rate or 1000) * seconds)
    exchanges = [_exchange(k, conversations, stitch, dep.id, version.id) for k in range(total)]
    before = Trace.objects.filter(deployment=dep).count()
    with tempfile.TemporaryDirectory() as spill:
        recorder = Recorder(queue_size=20000, batch_size=500, spill_dir=Path(spill))
        recorder.start()
        t0 = time.perf_counter()
        sent, deepest = 0, 0
        while sent < total:
            due = min(total, int((time.perf_counter() - t0) * rate) + 1) if rate else total
            while sent < due:
                exchanges[sent].started_at = time.time()
                recorder.submit(exchanges[sent])
                sent += 1
            deepest = max(deepest, recorder._queue.qsize())
            time.sleep(0.002)
        submitted = time.perf_counter()
        assert recorder.drain(300)
        done = time.perf_counter()
        spilled = recorder.stats["spilled"]
        recorder.stop()
    traces = Trace.objects.filter(deployment=dep).count() - before
    label = "on" if stitch else "off"
    if not rate:
        print(
            f"recorder, stitching {label}, fed all at once: {total} exchanges written in {done - t0:.2f} s, "
            f"{total / (done - t0):.0f} exchanges/s; {traces} traces"
        )
        return total / (done - t0)
    print(
        f"recorder, stitching {label}: {total} exchanges of {conversations} conversations at {total / (submitted - t0):.0f}/s "
        f"for {submitted - t0:.1f} s: deepest queue {deepest}, all written {done - submitted:.2f} s after the last, "
        f"{spilled} spilled; {traces} traces"
    )
    return done - submitted


if __name__ == "__main__":
    main()
