"""Ingest under load: many concurrent clients posting small batches, and whether every
acknowledged trace is stored exactly once.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/practicum .venv/bin/python bench/load_ingest.py

Starts uvicorn (`webapp.asgi:application`, as `make demo` runs it) on a free port against a
fresh database of its own (<name>_load, dropped and recreated), then --clients clients each
post --traces-per-batch traces of --messages messages to /api/v1/traces, one request after
another, for --duration seconds. Every external id is unique to one request. Afterwards it
counts what the database holds: a trace acknowledged (created or exists in a 207) must be
there once, with all its messages; nothing may be stored twice. It prints the requests, the
statuses, latency percentiles, traces acknowledged vs stored, duplicates and the most
database connections the server had open. Exit status 1 when any request failed (5xx,
a connection error, a timeout) or a trace is missing or duplicated.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import aiohttp
import orjson
import psycopg
from support import free_port, fresh_database

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def create_key(db_url: str) -> str:
    env = {**os.environ, "DATABASE_URL": db_url}
    out = subprocess.run(
        [sys.executable, "manage.py", "create_api_key", "--deployment", "load", "--scopes", "ingest", "--quiet"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def start_server(db_url: str, port: int, workers: int, log: Path) -> subprocess.Popen:
    # Its own data folder (the filesystem broker's queue of search-index tasks lands there).
    data = log.parent / "load_ingest-data"
    shutil.rmtree(data, ignore_errors=True)
    env = {**os.environ, "DATABASE_URL": db_url, "LOG_LEVEL": "WARNING", "PRACTICUM_DATA_DIR": str(data)}
    cmd = [str(ROOT / ".venv/bin/uvicorn"), "webapp.asgi:application", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--log-level", "warning", "--workers", str(workers), "--no-access-log"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"uvicorn exited: see {log}") from None
            time.sleep(0.2)
    raise SystemExit(f"uvicorn did not listen on {port} within 60 s: see {log}")


def stop_server(proc: subprocess.Popen) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


class ConnectionWatch:
    """Samples how many connections the server holds to its database, every 50 ms."""

    def __init__(self, db_url: str, database: str) -> None:
        self.admin = db_url.rsplit("/", 1)[0] + "/postgres"
        self.database = database
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.admin, autocommit=True) as conn:
            while not self._stop.wait(0.05):
                (n,) = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                    [self.database],
                ).fetchone()
                self.peak = max(self.peak, n)

    def __enter__(self) -> ConnectionWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def batch(client: int, seq: int, traces: int, messages: int, run: str) -> tuple[list[str], bytes]:
    ids = [f"{run}-c{client}-r{seq}-t{i}" for i in range(traces)]
    items = []
    for external_id in ids:
        msgs = [{"role": "system", "content": "You are a support agent."}]
        for k in range(1, messages):
            role = "user" if k % 2 else "assistant"
            msgs.append({"role": role, "content": f"{role} message {k} of {external_id}"})
        items.append({"external_id": external_id, "environment": "load", "messages": msgs})
    return ids, orjson.dumps({"traces": items})


async def client_loop(
    n: int, session: aiohttp.ClientSession, url: str, key: str, args, deadline: float, run: str, out: dict
) -> None:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    seq = 0
    while time.monotonic() < deadline:
        ids, body = batch(n, seq, args.traces_per_batch, args.messages, run)
        seq += 1
        started = time.perf_counter()
        try:
            async with session.post(url, data=body, headers=headers) as response:
                payload = await response.read()
                status = str(response.status)
        except (TimeoutError, aiohttp.ClientError) as exc:
            status, payload = f"client error: {type(exc).__name__}", b""
        out["latency"].append(time.perf_counter() - started)
        out["statuses"][status] += 1
        out["sent"].update(ids)
        if status == "207":
            for item in orjson.loads(payload)["results"]:
                if item["status"] in ("created", "exists"):
                    out["acknowledged"].add(item["external_id"])
                else:
                    out["item_errors"][str(item.get("errors"))[:200]] += 1
        elif status.startswith("5") and len(out["samples"]) < 5:
            out["samples"].append(f"{status}: {payload[:200]!r}")


async def load(url: str, key: str, args, run: str) -> dict:
    out = {
        "latency": [],
        "statuses": collections.Counter(),
        "acknowledged": set(),
        "sent": set(),
        "item_errors": collections.Counter(),
        "samples": [],
    }
    connector = aiohttp.TCPConnector(limit=args.clients)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        deadline = time.monotonic() + args.duration
        await asyncio.gather(
            *(client_loop(n, session, url, key, args, deadline, run, out) for n in range(args.clients))
        )
    return out


def stored(db_url: str, run: str) -> tuple[collections.Counter, dict[str, int], int]:
    """External ids of this run with how often each is stored, the message rows per trace,
    and traces whose message_count disagrees with their rows."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT t.external_id, t.message_count, count(m.id) FROM feedback_trace t "
            "LEFT JOIN feedback_message m ON m.trace_id = t.id WHERE t.external_id LIKE %s "
            "GROUP BY t.id, t.external_id, t.message_count",
            [f"{run}-%"],
        ).fetchall()
    counts = collections.Counter(r[0] for r in rows)
    messages = {r[0]: r[2] for r in rows}
    drift = sum(1 for r in rows if r[1] != r[2])
    return counts, messages, drift


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    parser.add_argument("--traces-per-batch", type=int, default=10)
    parser.add_argument("--messages", type=int, default=4, help="messages per trace")
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a client waits for one response")
    args = parser.parse_args()

    base = os.environ.get("DATABASE_URL", "")
    if not base.startswith("postgres"):
        raise SystemExit("set DATABASE_URL=postgres://… (a database of its own, <name>_load, is created)")
    db_url = fresh_database(base, "_load")
    key = create_key(db_url)
    port = free_port()
    log = ROOT / "var" / "bench" / "load_ingest-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    server = start_server(db_url, port, args.workers, log)
    run = uuid.uuid4().hex[:8]
    database = db_url.rsplit("/", 1)[1]
    try:
        with psycopg.connect(base.rsplit("/", 1)[0] + "/postgres") as conn:
            (max_connections,) = conn.execute("SHOW max_connections").fetchone()
        with ConnectionWatch(db_url, database) as watch:
            t0 = time.perf_counter()
            out = asyncio.run(load(f"http://127.0.0.1:{port}/api/v1/traces", key, args, run))
            elapsed = time.perf_counter() - t0
            time.sleep(1.0)
    finally:
        stop_server(server)
    counts, messages, drift = stored(db_url, run)

    requests = sum(out["statuses"].values())
    latency = sorted(out["latency"])
    p50 = statistics.median(latency) if latency else float("nan")
    p95 = latency[int(0.95 * (len(latency) - 1))] if latency else float("nan")
    acknowledged = out["acknowledged"]
    duplicates = sum(1 for n in counts.values() if n > 1)
    missing = [i for i in acknowledged if counts.get(i, 0) == 0]
    short = [i for i in acknowledged if counts.get(i) and messages[i] != args.messages]
    unacknowledged_stored = [i for i in counts if i not in acknowledged]
    failures = sum(n for s, n in out["statuses"].items() if not s.startswith(("2", "4")))

    print(
        f"load: {args.clients} clients x {args.duration:.0f} s, batches of {args.traces_per_batch} traces x "
        f"{args.messages} messages, uvicorn --workers {args.workers}, PostgreSQL max_connections={max_connections}"
    )
    print(f"requests:     {requests} in {elapsed:.1f} s ({requests / elapsed:.1f} req/s)")
    print(f"statuses:     {dict(sorted(out['statuses'].items()))}")
    if out["item_errors"]:
        print(f"item errors:  {dict(out['item_errors'])}")
    for sample in out["samples"]:
        print(f"  e.g. {sample}")
    print(f"latency:      p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {latency[-1] * 1000:.0f} ms")
    print(
        f"traces:       {len(acknowledged)} acknowledged, {sum(counts.values())} stored "
        f"({len(unacknowledged_stored)} stored without an acknowledgement, e.g. a request that timed out)"
    )
    print(
        f"exactly once: {duplicates} duplicated, {len(missing)} acknowledged but missing, "
        f"{len(short)} with missing messages, {drift} with a wrong message_count"
    )
    print(f"database:     at most {watch.peak} connections held by the server")
    ok = failures == 0 and not duplicates and not missing and not short and not drift
    print("result:       " + ("OK" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
