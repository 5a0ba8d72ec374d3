"""`make demo --fast` end to end: scripts/demo.sh on free ports and a fresh data folder (SQLite,
filesystem broker, the tiny model on a real vLLM server), the demo agent's traces, a logged-in
tour page, the documentation's examples run against it as printed (tests/docs/examples.py);
then Ctrl-C leaves no process of it behind and frees its ports."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings

from tests.docs.examples import page_failures
from tests.fixtures.processes import descendants
from training.inference.server import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_fast_demo_serves_the_tour_and_ctrl_c_stops_everything(tmp_path):
    port, inference_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRACTICUM_", "DATABASE_URL", "CELERY_"))}
    env |= {
        "PRACTICUM_DATA_DIR": str(tmp_path),
        # The talking tiny model test_modelprep builds there: `prepare_model tiny-talking` finds it.
        "PRACTICUM_MODELS_DIR": str(settings.DATA_DIR / "test-models"),
        "PRACTICUM_PORT": str(port),
        "PRACTICUM_INFERENCE_PORT": str(inference_port),
        "PRACTICUM_DEMO_EPISODES": "2",
    }
    log = (tmp_path / "demo.out").open("wb")
    started = time.monotonic()
    # A shell cannot trap a signal ignored when it starts, and an earlier fixture of a full run
    # may leave SIGINT ignored in this process: the demo gets a terminal's default, as `make demo`.
    demo = subprocess.Popen(
        ["scripts/demo.sh", "--fast"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    output = lambda: (tmp_path / "demo.out").read_text(errors="replace")  # noqa: E731
    try:
        while "Ready:" not in output():
            assert demo.poll() is None, f"the demo exited with {demo.returncode}:\n{output()[-3000:]}"
            assert time.monotonic() - started < 300, f"the demo was not ready in 300 s:\n{output()[-3000:]}"
            time.sleep(1)
        ready_after = time.monotonic() - started
        assert f"http://127.0.0.1:{port}/tour/" in output()
        assert "operator / operator-demo" in output() and "approver / approver-demo" in output()

        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=30) as web:
            assert web.get("/healthz").json() == {"ok": True}
            assert web.get("/tour/").status_code == 302  # to the login page
            login = web.get("/login/")
            token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text).group(1)
            answer = web.post(
                "/login/", data={"username": "operator", "password": "operator-demo", "csrfmiddlewaretoken": token}
            )
            assert answer.status_code == 302, answer.text[:500]
            tour = web.get("/tour/")
            assert tour.status_code == 200
            assert "deployment <b>support-bot</b>" in tour.text and '<b id="tour-live">tiny-talking</b>' in tour.text
            # The demo agent's episodes came through the gateway: the first step is ticked.
            assert 'id="step-traces" class="tour-step done' in tour.text, output()[-3000:]
        # The inference server answers only with its own key, generated into the data folder.
        key = (tmp_path / "inference_api_key").read_text().strip()
        served = httpx.get(
            f"http://127.0.0.1:{inference_port}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10
        ).json()
        assert [m["id"] for m in served["data"]] == ["tiny-talking"]

        # Run while the demo is up; asserted after its stop, so a stale example never hides
        # a process left behind.
        examples_failed = page_failures(url=base, env=env)

        tree = descendants(demo.pid)
        assert len(tree) >= 5  # vLLM supervisor and server, two workers, the web server
        # The console: no raw progress bars, the agent's progress as n/N episodes.
        assert "%|" not in output() and "it/s]" not in output()
        assert re.search(r"^\[2/2\] ", output(), re.M), output()[-3000:]
        demo.send_signal(signal.SIGINT)
        # A requested stop is a clean one: exit 0, so `make demo` prints no "Error 130".
        assert demo.wait(90) == 0
    finally:
        if demo.poll() is None:  # the test failed before its Ctrl-C: stop the demo the same way
            tree = descendants(demo.pid)
            demo.send_signal(signal.SIGINT)
            try:
                demo.wait(90)
            except subprocess.TimeoutExpired:
                demo.kill()
            for pid in tree:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(os.getpgid(pid), signal.SIGKILL)
        log.close()
    left = sorted(pid for pid in tree if running(pid))
    assert left == [], f"processes left behind: {left}"
    assert not port_open(port) and not port_open(inference_port)
    assert examples_failed == [], "\n\n".join(examples_failed)
    print(f"fast demo ready after {ready_after:.0f} s; stopped cleanly")
