"""Time from approving a promotion to the new version answering through the gateway.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/practicum \\
    CELERY_BROKER_URL=redis://127.0.0.1:6379/0 nice -n 10 .venv/bin/python bench/promotion.py

Everything is real and runs as in production: a vLLM server on the tiny test model, a Celery
worker on the `deploy` queue, and two gateways (uvicorn, webapp.asgi) with the default live
cache (PRACTICUM_GATEWAY_LIVE_CACHE_SECONDS, 2 s): one LISTENs for flips (the default on
PostgreSQL), the other relies on the cache TTL alone (PRACTICUM_GATEWAY_LIVE_LISTEN=0).

Each cycle registers a new version of the tool-call adapter under a new name (so the
server really loads it), approves its promotion (`promotion_approve`, the service behind
the page button and the API) and then, from two threads, asks each gateway for one token
until it answers with the new version (`x-practicum-model-version`). Then it rolls back
and waits for the version before again: an adapter that answers a greeting, live from the
start (the random tiny model itself answers only newlines, which a release's smoke test
refuses, so a rollback to it would fail). The evaluation a promotion needs is stored as
finished: the figure is approval to serving, not evaluation time.

Uses its own database (<name>_promobench), dropped and recreated each run.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from support import free_port  # noqa: E402  (bench/, the script's own folder)


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def setup_database(base_url: str) -> str:
    import psycopg

    head, _, name = base_url.rpartition("/")
    name = f"{name or 'practicum'}_promobench"
    with psycopg.connect(f"{head}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{head}/{name}"
    env = {**os.environ, "DATABASE_URL": url}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    return url


def first_serving(port: int, key: str, name: str, started: float, out: dict, label: str, stop: threading.Event):
    """Ask the gateway for one token until the answer comes from `name`."""
    body = {"model": "agent", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        while not stop.is_set():
            response = http.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
            if response.headers.get("x-practicum-model-version") == name:
                out[label] = time.monotonic() - started
                return


def wait_both(ports: dict[str, int], key: str, name: str, started: float, timeout: float = 60) -> dict[str, float]:
    out: dict[str, float] = {}
    stop = threading.Event()
    threads = [
        threading.Thread(target=first_serving, args=(port, key, name, started, out, label, stop), daemon=True)
        for label, port in ports.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    stop.set()
    missing = set(ports) - set(out)
    if missing:
        raise RuntimeError(f"{missing} never served {name} within {timeout} s")
    return out


def person(username: str, role: str):
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user(username)
    user.groups.add(Group.objects.get(name=role))
    return user


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=10)
    args = parser.parse_args()
    base_url = os.environ.get("DATABASE_URL", "")
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not base_url.startswith("postgres") or not broker.startswith("redis"):
        sys.exit("bench/promotion.py needs DATABASE_URL=postgres://… and CELERY_BROKER_URL=redis://…")
    db_url = setup_database(base_url)
    os.environ["DATABASE_URL"] = db_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    import django

    django.setup()
    from django.conf import settings

    from feedback.services.api_keys import api_key_create
    from tests.fixtures.adapters import TALKING_TEXT, tiny_adapter_train
    from training.inference.server import InferenceServer, ServerSpec
    from training.modelprep import tiny_prepare
    from training.promotion.models import Evaluation, Release
    from training.promotion.services.promotion import promotion_approve, promotion_request_create
    from training.promotion.services.rollback import rollback_request
    from training.serving.models import ModelVersion
    from training.serving.services import (
        base_model_register,
        deployment_get_or_create,
        live_version_set,
        model_version_create,
    )

    model_dir = tiny_prepare(settings.DATA_DIR / "test-models" / "tiny")
    adapter = tiny_adapter_train(model_dir, settings.DATA_DIR / "test-models" / "tiny-lora-tool-call")
    talking = tiny_adapter_train(model_dir, settings.DATA_DIR / "test-models" / "tiny-lora-talking", text=TALKING_TEXT)
    spec = ServerSpec(model_path=str(model_dir), served_name="tiny", port=free_port(), max_model_len=1024,
                      max_lora_rank=16, max_loras=4, kv_cache_gib=1, api_key=settings.INFERENCE_API_KEY)  # fmt: skip
    server = InferenceServer(spec, log_path=settings.DATA_DIR / "logs" / "bench-promotion-vllm.log")
    procs: list[subprocess.Popen] = []
    try:
        server.start()
        base, tiny_version = base_model_register(name="tiny", path=model_dir, inference_url=spec.url)
        base_version = model_version_create(
            name="tiny-talking", base_model=base, kind="lora", path=talking, parent=tiny_version
        )
        deployment = deployment_get_or_create(name="support-bot")
        live_version_set(deployment=deployment, version=base_version)
        key = api_key_create(deployment=deployment, scopes=["ingest"]).plaintext
        operator, approver = person("olga", "operator"), person("arno", "approver")
        env = {**os.environ, "DATABASE_URL": db_url}
        procs.append(
            subprocess.Popen(
                [str(Path(sys.executable).parent / "celery"), "-A", "webapp", "worker", "-Q", "deploy",
                 "--pool", "solo", "-n", f"bench-{os.getpid()}@localhost", "--without-gossip", "--without-mingle",
                 "--loglevel", "WARNING"],
                cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
            )
        )  # fmt: skip
        ports = {"listen": free_port(), "ttl only": free_port()}
        for label, port in ports.items():
            gw_env = {**env, "PRACTICUM_GATEWAY_LIVE_LISTEN": "1" if label == "listen" else "0"}
            procs.append(
                subprocess.Popen(
                    [str(Path(sys.executable).parent / "uvicorn"), "webapp.asgi:application", "--port", str(port),
                     "--log-level", "warning", "--no-access-log"],
                    cwd=ROOT, env=gw_env,
                )
            )  # fmt: skip
        server.wait_ready(timeout=600)
        server.client().adapter_load(base_version.name, talking)
        for port in ports.values():
            wait_port(port)
        wait_both(ports, key, base_version.name, time.monotonic())  # warm both gateways
        ttl = settings.GATEWAY_LIVE_CACHE_SECONDS
        print(f"tiny model on vllm at {spec.url}; gateway live cache {ttl:g} s; {args.cycles} cycles\n")
        print(f"{'cycle':>5} {'release steps: picked up / loaded / smoke / live (ms)':>52} "
              f"{'serving: listen':>16} {'ttl only':>9} {'rollback: listen':>17} {'ttl only':>9}")  # fmt: skip
        rows = []
        for i in range(args.cycles):
            candidate = model_version_create(
                name=f"tiny-tools-bench-{i}", base_model=base, kind="lora", path=adapter, parent=base_version
            )
            evaluation = Evaluation.objects.create(
                deployment=deployment, candidate=candidate, baseline=base_version, status="finished", total=0
            )
            promotion = promotion_request_create(
                candidate=candidate, deployment=deployment, evaluation=evaluation, requested_by=operator
            )
            started = time.monotonic()
            release = promotion_approve(promotion=promotion, user=approver, comment="bench")
            serving = wait_both(ports, key, candidate.name, started)
            release = Release.objects.get(pk=release.pk)
            assert release.status == "finished", release.error
            started = time.monotonic()
            rollback_request(deployment=deployment, user=approver, reason="bench")
            back = wait_both(ports, key, base_version.name, started)
            t = release.timings
            rows.append((t["live_ms"] / 1000, serving["listen"], serving["ttl only"], back["listen"], back["ttl only"]))
            steps = f"{t['picked_up_ms']} / {t['loaded_ms']} / {t['smoke_ms']} / {t['live_ms']}"
            print(f"{i:>5} {steps:>52} {serving['listen']:>15.2f}s {serving['ttl only']:>8.2f}s "
                  f"{back['listen']:>16.2f}s {back['ttl only']:>8.2f}s")  # fmt: skip
        columns = list(zip(*rows, strict=True))
        med = [statistics.median(c) for c in columns]
        worst = [max(c) for c in columns]
        print(f"\n{'':>5} {'':>52} {'listen':>16} {'ttl only':>9} {'listen':>17} {'ttl only':>9}")
        print(f"{'p50':>5} {f'live pointer switched {med[0]:.2f} s after approval':>52} "
              f"{med[1]:>15.2f}s {med[2]:>8.2f}s {med[3]:>16.2f}s {med[4]:>8.2f}s")  # fmt: skip
        print(f"{'max':>5} {f'{worst[0]:.2f} s':>52} {worst[1]:>15.2f}s {worst[2]:>8.2f}s "
              f"{worst[3]:>16.2f}s {worst[4]:>8.2f}s")  # fmt: skip
        print(f"\napproval → serving, p50 ratio ttl-only / listen: {med[2] / med[1]:.2f}")
        assert ModelVersion.objects.filter(name__startswith="tiny-tools-bench-").count() == args.cycles
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
        server.stop()


if __name__ == "__main__":
    main()
