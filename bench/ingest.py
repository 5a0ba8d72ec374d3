"""Ingest throughput: POST /api/v1/traces vs a raw COPY of the same rows, side by side.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/practicum .venv/bin/python bench/ingest.py

Batches of 100 traces x 8 messages (~200-byte messages, then ~4 KB). The API runs under
uvicorn (the production server) with --workers (default 2), posted to by --clients
concurrent clients; the COPY side writes the same rows straight into the same tables with
psycopg's COPY, which is the physical limit. Rounds alternate API and COPY so machine
noise hits both. Uses its own database (<name>_bench), dropped and recreated each run.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson

logging.getLogger("httpx").setLevel(logging.WARNING)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from support import fresh_database, site  # noqa: E402  (bench/, the script's own folder)


def make_batch(n_traces: int, n_messages: int, msg_bytes: int, tag: str) -> list[dict]:
    filler = ("lorem ipsum dolor sit amet " * (msg_bytes // 27 + 1))[:msg_bytes]
    traces = []
    for i in range(n_traces):
        msgs = [{"role": "system", "content": filler}]
        for k in range(1, n_messages):
            msgs.append({"role": "user" if k % 2 else "assistant", "content": filler})
        traces.append(
            {
                "external_id": f"{tag}-{i}",
                "session_id": f"s-{i % 10}",
                "environment": "bench",
                "model": "bench-model",
                "metadata": {"i": i},
                "messages": msgs,
            }
        )
    return traces


def setup_database(base_url: str) -> str:
    return fresh_database(base_url, "_bench")


def create_key(db_url: str) -> tuple[str, int]:
    os.environ["DATABASE_URL"] = db_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from feedback.services.api_keys import api_key_create
    from training.serving.services import deployment_get_or_create

    dep = deployment_get_or_create(name="bench")
    return api_key_create(deployment=dep, scopes=["ingest"]).plaintext, dep.id


def run_api(base: str, key: str, bodies: list[bytes], clients: int) -> float:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def send(body: bytes) -> None:
        r = http.post(f"{base}/api/v1/traces", content=body, headers=headers)
        if r.status_code != 207 or r.json()["created"] != 100:
            raise RuntimeError(f"ingest failed: {r.status_code} {r.text[:300]}")

    with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=clients)) as http:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(send, bodies))
        return time.perf_counter() - t0


def run_copy(db_url: str, deployment_id: int, batches: list[list[dict]]) -> float:
    import psycopg

    def Jsonb(value) -> str:
        return orjson.dumps(value).decode()

    t0 = time.perf_counter()
    with psycopg.connect(db_url) as conn:
        for traces in batches:
            with conn.transaction():
                ids = [
                    r[0]
                    for r in conn.execute(
                        "SELECT nextval(pg_get_serial_sequence('feedback_trace', 'id')) FROM generate_series(1, %s)",
                        (len(traces),),
                    )
                ]
                now = time.strftime("%Y-%m-%d %H:%M:%S+00")
                with conn.cursor().copy(
                    "COPY feedback_trace (id, deployment_id, external_id, session_id, environment, source, "
                    "model_name, started_at, created_at, updated_at, status, metadata, tools, raw, message_count, "
                    "assistant_turn_count, tool_call_count, total_tokens, preview, has_comment, "
                    "has_customer_feedback) FROM STDIN"
                ) as copy:
                    for tid, t in zip(ids, traces, strict=True):
                        copy.write_row(
                            (
                                tid,
                                deployment_id,
                                t["external_id"],
                                t["session_id"],
                                t["environment"],
                                "ingest",
                                t["model"],
                                now,
                                now,
                                now,
                                "ok",
                                Jsonb(t["metadata"]),
                                Jsonb([]),
                                Jsonb({k: v for k, v in t.items() if k != "messages"}),
                                len(t["messages"]),
                                0,
                                0,
                                0,
                                "",
                                False,
                                False,
                            )
                        )
                with conn.cursor().copy(
                    "COPY feedback_message (trace_id, position, role, content, name, tool_call_id, raw, "
                    "created_at, response_id, finish_reason) FROM STDIN"
                ) as copy:
                    for tid, t in zip(ids, traces, strict=True):
                        for pos, m in enumerate(t["messages"]):
                            copy.write_row((tid, pos, m["role"], m["content"], "", "", Jsonb(m), now, "", ""))
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=30, help="batches of 100 traces per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url.startswith("postgres"):
        sys.exit("bench/ingest.py needs DATABASE_URL=postgres://…")
    db_url = setup_database(base_url)
    key, deployment_id = create_key(db_url)
    with site(db_url, port=args.port, workers=args.workers) as base:
        print(f"{'messages':>10} {'round':>5} {'API traces/s':>13} {'COPY traces/s':>14} {'API/COPY':>9}")
        for size in (200, 4000):
            # Warm-up: connections, caches, the JIT-free paths of both sides.
            run_api(base, key, [orjson.dumps({"traces": make_batch(100, 8, size, f"w{size}-{uuid.uuid4().hex}")})], 1)
            api_rates, copy_rates = [], []
            for r in range(args.rounds):
                n = args.batches
                bodies = [orjson.dumps({"traces": make_batch(100, 8, size, f"a{size}-{r}-{b}")}) for b in range(n)]
                api_s = run_api(base, key, bodies, args.clients)
                copy_batches = [make_batch(100, 8, size, f"c{size}-{r}-{b}") for b in range(n)]
                copy_s = run_copy(db_url, deployment_id, copy_batches)
                api_rates.append(n * 100 / api_s)
                copy_rates.append(n * 100 / copy_s)
                print(
                    f"{size:>8}B {r:>5} {api_rates[-1]:>13.0f} {copy_rates[-1]:>14.0f} {api_rates[-1] / copy_rates[-1]:>9.2f}"
                )
            api_m, copy_m = statistics.median(api_rates), statistics.median(copy_rates)
            print(f"{size:>8}B  median {api_m:>11.0f} {copy_m:>14.0f} {api_m / copy_m:>9.2f}")


if __name__ == "__main__":
    main()
