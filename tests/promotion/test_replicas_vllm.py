"""One base model served by two real vLLM replicas of the tiny model: the session's server,
and a second one supervised by `manage.py serve_inference` in a subprocess (which loads the
live adapters each time its server is up, as in production).

A release loads and smoke-tests the candidate on both before the pointer flips. Then, under
load through the gateway, the second replica's vLLM is killed: its supervisor restarts it,
the gateway retries on the first replica what the dead one had not begun answering, takes
the second back only once it serves the live adapter, and no request is lost. A rollback
goes through the same steps, and the old adapter is unloaded from both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from django.conf import settings

import training.promotion.services.release as release_service
import training.promotion.services.rollback as rollback_service
from feedback.models import Trace
from feedback.services.api_keys import api_key_create
from tests.factories import DeploymentFactory
from tests.fixtures.inference import talking_version_create
from tests.fixtures.worker import _database_url
from tests.promotion.test_release_vllm import approved_release
from training.inference.client import InferenceClient
from training.inference.server import free_port
from training.promotion.models import ReleaseKind
from training.serving.models import LiveVersion
from training.serving.services import base_model_replicas_set, live_version_set, model_version_create
from webapp.kernel.work import WorkStatus

pytestmark = [pytest.mark.vllm, pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LEN = ("--max-model-len", "1024")  # as the session's server: small KV cache, quick start


def served(url: str) -> set[str]:
    try:
        return {m.id for m in InferenceClient(url, api_key=settings.INFERENCE_API_KEY, retries=0).models()}
    except Exception:
        return set()


def wait_for(predicate, timeout: float, what: str, logs: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            tails = [
                f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted((logs or ROOT).rglob("*.err"))
            ]
            tails += [
                f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted((logs or ROOT).rglob("*.log"))
            ]
            raise AssertionError(f"{what}: not within {timeout:.0f} s\n" + ("\n".join(tails) if logs else ""))
        time.sleep(0.5)


def vllm_child(supervisor: subprocess.Popen) -> int | None:
    """The vLLM server the supervisor runs now (its own process group's leader)."""
    try:
        children = Path(f"/proc/{supervisor.pid}/task/{supervisor.pid}/children").read_text().split()
    except OSError:
        return None
    for pid in map(int, children):
        try:
            if b"vllm.entrypoints" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except OSError:
            continue
    return None


@pytest.fixture
def second_replica(transactional_db, tiny_base, tmp_path):
    """`serve_inference` for the tiny base on a free port, recorded as its second replica;
    yields (url, supervisor process) once its server answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    base_model_replicas_set(base=tiny_base, urls=[url])
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "PRACTICUM_INFERENCE_API_KEY": settings.INFERENCE_API_KEY,
        "PRACTICUM_INFERENCE_KV_CACHE_GIB": "1",
        "PRACTICUM_INFERENCE_MAX_LORA_RANK": "16",
        "PRACTICUM_DATA_DIR": str(tmp_path),
    }
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        # The session's server binds its engine to the first CPU (vLLM's own choice); this
        # one takes the last, as `serve_inference --replicas` would, so a restart under load
        # does not queue behind the other engine on one core.
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpus[-1])
    supervisor = subprocess.Popen(
        # A restart that hangs is given up on (its stacks to its log) and started again well
        # within the test's 600 s wait for it.
        [
            sys.executable,
            "manage.py",
            "serve_inference",
            "--base",
            tiny_base.name,
            "--port",
            str(port),
            "--ready-timeout",
            "240",
            *LEN,
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "serve_inference.err").open("wb"),
    )
    try:
        wait_for(lambda: tiny_base.name in served(url), 600, "the second replica starting", tmp_path)
        yield url, supervisor, tmp_path
    finally:
        supervisor.send_signal(signal.SIGTERM)
        try:
            supervisor.wait(60)
        except subprocess.TimeoutExpired:
            child = vllm_child(supervisor)
            if child is not None:
                os.killpg(child, signal.SIGKILL)
            supervisor.kill()
            supervisor.wait(10)


def test_a_release_reaches_both_replicas_and_a_killed_replica_loses_no_request_and_comes_back_with_the_live_adapter(
    vllm_server,
    tiny_base,
    tool_call_adapter_path,
    talking_adapter_path,
    second_replica,
    gateway,
    operator,
    approver,
    monkeypatch,
):
    first_url, (second_url, supervisor, logs) = vllm_server.url, second_replica
    deployment = DeploymentFactory(name="replicated")
    # The version to roll back to answers with text on both replicas (the rollback loads it
    # into each); the random tiny model itself answers only newlines.
    base_version = talking_version_create(tiny_base, talking_adapter_path, name="tiny-talking-replicated")
    live_version_set(deployment=deployment, version=base_version)
    candidate = model_version_create(
        name="tiny-replicated", base_model=tiny_base, kind="lora", path=tool_call_adapter_path, parent=base_version
    )

    # --- the release: both replicas serve the candidate before the pointer moves
    at_flip: dict[str, set[str]] = {}
    flip = release_service.live_version_set

    def watched_flip(**kwargs):
        at_flip.update({url: served(url) for url in (first_url, second_url)})
        return flip(**kwargs)

    monkeypatch.setattr(release_service, "live_version_set", watched_flip)
    _, release = approved_release(deployment, candidate, base_version, operator, approver)
    release = release_service.release_run(release_id=release.pk)
    assert release.status == WorkStatus.FINISHED, release.error
    assert all(candidate.name in names for names in at_flip.values()), at_flip
    assert [r["replica"] for r in release.smoke["replicas"]] == [first_url, second_url]
    assert LiveVersion.objects.get(deployment=deployment).version == candidate

    # --- load through the gateway while the second replica's server is killed and restarted
    key = api_key_create(deployment=deployment, scopes=["ingest"]).plaintext
    balancer = gateway.app.balancer
    results: list[tuple[int, str]] = []
    stop = threading.Event()

    def client(worker: int) -> None:
        with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
            i = 0
            while not stop.is_set():
                i += 1
                trace = f"load-{worker}-{i}-{uuid.uuid4().hex[:6]}"
                body = {"model": "any", "messages": [{"role": "user", "content": "Where is A1001?"}], "max_tokens": 6}
                response = http.post("/v1/chat/completions", json=body, headers={"X-Practicum-Trace-Id": trace})
                results.append((response.status_code, trace))
                time.sleep(0.05)  # steady load that leaves the restarting replica some CPU

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(2)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: balancer.replica(second_url).sent >= 3, 60, "the second replica taking traffic")
        old = vllm_child(supervisor)
        assert old is not None
        os.killpg(old, signal.SIGKILL)
        wait_for(lambda: not balancer.replica(second_url).healthy, 30, "the gateway taking the killed replica out")
        sent_while_down = balancer.replica(second_url).sent
        wait_for(lambda: balancer.replica(second_url).healthy, 600, "the restarted replica back in the gateway", logs)
        restarted = vllm_child(supervisor)
        assert restarted is not None and restarted != old
        # Back in only because it serves the live adapter again (its supervisor loaded it).
        assert candidate.name in served(second_url)
        wait_for(lambda: balancer.replica(second_url).sent >= sent_while_down + 3, 60, "traffic to it again")
    finally:
        stop.set()
        for thread in threads:
            thread.join(130)

    statuses = [status for status, _ in results]
    assert len(statuses) >= 10
    assert statuses == [200] * len(statuses), sorted(set(statuses))
    gateway.drain()
    # Every request logged once, retried or not.
    assert Trace.objects.filter(external_id__startswith="load-").count() == len(results)

    # --- rollback through the same path; then the adapter that left service is unloaded from both
    back = release_service.release_run(
        release_id=rollback_service.rollback_request(deployment=deployment, user=approver).pk
    )
    assert back.status == WorkStatus.FINISHED and back.kind == ReleaseKind.ROLLBACK, back.error
    assert len(back.smoke["replicas"]) == 2
    assert release_service.release_adapter_unload(version_id=candidate.pk) == [first_url, second_url]
    assert candidate.name not in served(first_url) | served(second_url)
