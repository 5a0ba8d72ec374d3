"""OTLP ingest throughput beside the batch API, side by side on the same conversations.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/practicum .venv/bin/python bench/otlp.py

Each agent run is a system prompt, a question, three tool rounds and an answer (9 messages). As the
batch API gets it: one trace item. As an instrumented agent exports it (OpenTelemetry GenAI
conventions): an agent span, four chat spans whose input repeats the conversation so far,
and three tool spans — 8 spans, one export request per 50 runs (what the SDK's batch
processor sends). Both go to uvicorn (--workers, default 2) from --clients concurrent
clients; rounds alternate OTLP and batch so machine noise hits both. After the warm-up
requests the tables are ANALYZEd, as autovacuum would (a server without it plans worse as
the tables grow). Prints runs/s for both, spans/s for OTLP, and the ratio. Uses its own
database (<name>_bench), recreated each run; --stored-spans N puts N spans of earlier runs in
it first, as a server holds them over its retention window.

Then one long run, as a long-running agent exports it: the real OpenTelemetry SDK's OTLP/HTTP
exporter behind a SimpleSpanProcessor (one export per finished span) sends --spans spans of
one trace (default 1,200; --spans 5000 is the per-trace limit). Each step of the run is a
model call whose input repeats the conversation so far and asks for a tool, the tool's span,
and four spans of other work (an HTTP call, a query, a cache read, a log write). Prints the
median export latency of exports 100-200 and of the last 100, and their ratio (the cost of
an export should depend on the spans it carries, not on how long the run is); the model-call
exports, which carry the whole conversation, are shown apart.
"""

from __future__ import annotations

import argparse
import json
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

RUNS_PER_REQUEST = 50
SPANS_PER_RUN = 8


def conversation(i: int, size: int) -> list[dict]:
    filler = ("lorem ipsum dolor sit amet " * (size // 27 + 1))[:size]
    messages = [{"role": "system", "content": filler}, {"role": "user", "content": f"order {i}: {filler}"}]
    for k in range(3):
        call = {"id": f"call_{k}", "type": "function", "function": {"name": "lookup", "arguments": f'{{"n": {k}}}'}}
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{k}", "content": filler},
        ]
    return [*messages, {"role": "assistant", "content": filler}]


def _parts(message: dict) -> dict:
    if message["role"] == "tool":
        return {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": message["tool_call_id"], "response": message["content"]}],
        }
    parts = [{"type": "text", "content": message["content"]}] if message.get("content") else []
    for c in message.get("tool_calls") or []:
        parts.append(
            {"type": "tool_call", "id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        )
    return {"role": message["role"], "parts": parts}


def otlp_body(tag: str, size: int) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    t0 = time.time_ns()
    for i in range(RUNS_PER_REQUEST):
        trace_id = uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}-{i}").bytes
        messages = conversation(i, size)
        root = scope.spans.add(
            trace_id=trace_id,
            span_id=os.urandom(8),
            name="invoke_agent",
            start_time_unix_nano=t0,
            end_time_unix_nano=t0 + 9_000,
        )
        root.attributes.add(key="gen_ai.operation.name").value.string_value = "invoke_agent"
        # A chat span before each assistant turn; a tool span after each call.
        for at, message in enumerate(messages):
            start = t0 + at * 1000
            if message["role"] == "assistant":
                span = scope.spans.add(
                    trace_id=trace_id,
                    span_id=os.urandom(8),
                    parent_span_id=root.span_id,
                    name="chat",
                    start_time_unix_nano=start,
                    end_time_unix_nano=start + 500,
                )
                attrs = {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "bench-model",
                    "gen_ai.system_instructions": json.dumps([{"type": "text", "content": messages[0]["content"]}]),
                    "gen_ai.input.messages": json.dumps([_parts(m) for m in messages[1:at]]),
                    "gen_ai.output.messages": json.dumps([_parts(message)]),
                }
                for k, v in attrs.items():
                    span.attributes.add(key=k).value.string_value = v
                span.attributes.add(key="gen_ai.usage.output_tokens").value.int_value = 20
            elif message["role"] == "tool":
                span = scope.spans.add(
                    trace_id=trace_id,
                    span_id=os.urandom(8),
                    parent_span_id=root.span_id,
                    name="execute_tool",
                    start_time_unix_nano=start,
                    end_time_unix_nano=start + 200,
                )
                for k, v in (
                    ("gen_ai.operation.name", "execute_tool"),
                    ("gen_ai.tool.call.id", message["tool_call_id"]),
                    ("gen_ai.tool.call.result", message["content"]),
                ):
                    span.attributes.add(key=k).value.string_value = v
    return request.SerializeToString()


def batch_body(tag: str, size: int) -> bytes:
    traces = [
        {"external_id": f"{tag}-{i}", "model": "bench-model", "messages": conversation(i, size)}
        for i in range(RUNS_PER_REQUEST)
    ]
    return orjson.dumps({"traces": traces})


def create_key(db_url: str) -> str:
    os.environ["DATABASE_URL"] = db_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from feedback.services.api_keys import api_key_create
    from training.serving.services import deployment_get_or_create

    return api_key_create(deployment=deployment_get_or_create(name="bench"), scopes=["ingest"]).plaintext


def analyze(db_url: str) -> None:
    """Table statistics, as autovacuum keeps them on a server that runs it: without any, the
    planner reads a trace by its deployment's index and filters every row of the run so far
    (a cost that grows with the table, on both sides, not the one this bench compares)."""
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ANALYZE")


def spans_store(db_url: str, spans: int) -> None:
    """`spans` spans of earlier runs (8 a trace), as a server holds them over its retention
    window (a day by default), so that a lookup whose cost follows the table shows."""
    import psycopg

    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO feedback_otelspan (deployment_id, trace_id, span_id, start_ns, data, held, received_at) "
            "SELECT d.id, md5('kept' || (g / 8)::text), lpad(to_hex(g), 16, '0'), 0, '{}', false, now() "
            "FROM generate_series(1, %s) g, feedback_deployment d WHERE d.name = 'bench'",
            [spans],
        )


def send_all(base: str, key: str, bodies: list[bytes], clients: int, *, otlp: bool) -> float:
    path, kind = (
        ("/api/v1/otel/v1/traces", "application/x-protobuf") if otlp else ("/api/v1/traces", "application/json")
    )
    headers = {"Authorization": f"Bearer {key}", "Content-Type": kind}

    def send(body: bytes) -> None:
        r = http.post(base + path, content=body, headers=headers)
        if otlp:
            from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

            ok = (
                r.status_code == 200
                and not ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans
            )
        else:
            ok = r.status_code == 207 and r.json()["created"] == RUNS_PER_REQUEST
        if not ok:
            raise RuntimeError(f"{path} failed: {r.status_code} {r.content[:300]!r}")

    with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=clients)) as http:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(send, bodies))
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20, help="requests of 50 runs per round and side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--spans", type=int, default=1200, help="spans of the long run (0: none; 5000: the limit)")
    parser.add_argument("--stored-spans", type=int, default=0, help="spans of earlier runs the server holds already")
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url.startswith("postgres"):
        sys.exit("bench/otlp.py needs DATABASE_URL=postgres://…")
    db_url = fresh_database(base_url, "_bench")
    key = create_key(db_url)
    if args.stored_spans:
        spans_store(db_url, args.stored_spans)
    with site(db_url, port=args.port, workers=args.workers) as base:
        print(
            f"{'message':>8} {'round':>5} {'OTLP runs/s':>12} {'OTLP spans/s':>13} {'batch runs/s':>13} {'OTLP/batch':>11}"
        )
        for size in (200, 2000):
            sizes = len(otlp_body("size", size)), len(batch_body("size", size))
            print(f"{size:>7}B bytes a request of {RUNS_PER_REQUEST} runs: OTLP {sizes[0]:,}, batch {sizes[1]:,}")
            send_all(base, key, [otlp_body(f"w{size}", size)], 1, otlp=True)
            send_all(base, key, [batch_body(f"w{size}", size)], 1, otlp=False)
            analyze(db_url)
            otlp_rates, batch_rates = [], []
            for r in range(args.rounds):
                runs = args.requests * RUNS_PER_REQUEST
                otlp_s = send_all(
                    base,
                    key,
                    [otlp_body(f"o{size}-{r}-{b}", size) for b in range(args.requests)],
                    args.clients,
                    otlp=True,
                )
                batch_s = send_all(
                    base,
                    key,
                    [batch_body(f"b{size}-{r}-{b}", size) for b in range(args.requests)],
                    args.clients,
                    otlp=False,
                )
                otlp_rates.append(runs / otlp_s)
                batch_rates.append(runs / batch_s)
                print(
                    f"{size:>7}B {r:>5} {otlp_rates[-1]:>12.0f} {otlp_rates[-1] * SPANS_PER_RUN:>13.0f} "
                    f"{batch_rates[-1]:>13.0f} {otlp_rates[-1] / batch_rates[-1]:>11.2f}"
                )
            o, b = statistics.median(otlp_rates), statistics.median(batch_rates)
            print(f"{size:>7}B median {o:>11.0f} {o * SPANS_PER_RUN:>13.0f} {b:>13.0f} {o / b:>11.2f}")
        if args.spans:
            long_run(base, key, args.spans)


STEP_SPANS = ("chat", "execute_tool", "GET /orders", "SELECT orders", "cache get", "log write")


def long_run(base: str, key: str, spans: int) -> None:
    """One trace of `spans` spans, each exported alone as it ends (see the module docstring)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

    exporter = OTLPSpanExporter(endpoint=f"{base}/api/v1/otel/v1/traces", headers={"Authorization": f"Bearer {key}"})
    timings: list[tuple[str, float]] = []
    export = exporter.export

    def timed(batch):
        t0 = time.perf_counter()
        result = export(batch)
        timings.append((batch[0].name, time.perf_counter() - t0))
        if result is not SpanExportResult.SUCCESS:
            raise RuntimeError(f"export {len(timings)} failed")
        return result

    exporter.export = timed
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    history = [{"role": "user", "parts": [{"type": "text", "content": "Audit the open orders, one by one."}]}]
    t0 = time.perf_counter()
    with tracer.start_as_current_span("invoke_agent audit") as run:
        run.set_attribute("gen_ai.operation.name", "invoke_agent")
        step = 0
        while len(timings) < spans - 1:  # the agent's own span is the last export
            call_id = f"call_{step}"
            call = {
                "role": "assistant",
                "parts": [{"type": "tool_call", "id": call_id, "name": "lookup", "arguments": {"order": step}}],
            }
            for name in STEP_SPANS[: spans - 1 - len(timings)]:
                with tracer.start_as_current_span(name) as span:
                    if name == "chat":
                        span.set_attribute("gen_ai.operation.name", "chat")
                        span.set_attribute("gen_ai.request.model", "bench-model")
                        span.set_attribute("gen_ai.input.messages", json.dumps(history))
                        span.set_attribute("gen_ai.output.messages", json.dumps([call]))
                        span.set_attribute("gen_ai.usage.output_tokens", 12)
                    elif name == "execute_tool":
                        span.set_attribute("gen_ai.operation.name", "execute_tool")
                        span.set_attribute("gen_ai.tool.call.id", call_id)
                        span.set_attribute("gen_ai.tool.call.result", f'{{"order": {step}, "status": "shipped"}}')
                    else:
                        span.set_attribute("http.route" if name.startswith("GET") else "db.operation", name)
            result = {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": "ok"}]}
            history += [call, result]
            step += 1
    provider.shutdown()
    elapsed = time.perf_counter() - t0
    ms = [t * 1000 for _, t in timings]
    early, late = statistics.median(ms[100:200]), statistics.median(ms[-100:])
    chat = [t * 1000 for name, t in timings if name == "chat"]
    print(
        f"\nlong run: {len(ms)} exports of one span each (one trace, {step} model calls), {elapsed:.0f} s\n"
        f"  median export latency, exports 100-200: {early:.2f} ms; last 100: {late:.2f} ms; "
        f"ratio {late / early:.2f}\n"
        f"  model-call exports (their input is the whole conversation): median of the first 20 "
        f"{statistics.median(chat[:20]):.2f} ms, of the last 20 {statistics.median(chat[-20:]):.2f} ms"
    )


if __name__ == "__main__":
    main()
