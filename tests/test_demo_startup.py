"""`make demo` while it starts: the console says what it waits for as time passes (with the
stage the inference server's log names), and an empty trace list says the demo agent is
starting rather than asking for traces to be sent."""

from __future__ import annotations

import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.urls import reverse

from tests.factories import DeploymentFactory, TraceFactory, user_with_role

ROOT = Path(__file__).resolve().parents[1]


class _Health(BaseHTTPRequestHandler):
    ready = threading.Event()

    def do_GET(self) -> None:
        self.send_response(200 if self.ready.is_set() else 503)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def health_server():
    _Health.ready = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/health", _Health.ready
    server.shutdown()


def wait_ready(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "wait_ready.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_wait_for_the_inference_server_says_how_long_and_at_what_stage(health_server, tmp_path):
    url, ready = health_server
    log = tmp_path / "inference.log"
    log.write_text(
        "\x1b[1;36m(APIServer pid=7)\x1b[0m INFO 12-06 09:41:02 [api_server.py:1] vLLM API server version 0.11\n"
        "INFO 12-06 09:41:09 [default_loader.py:267] Loading weights took 0.12 seconds\n\n"
    )
    waiting = wait_ready(url, "60", "the inference server", "--log", str(log), "--every", "0.3")
    first = waiting.stdout.readline()
    assert first.startswith("  … waiting for the inference server: 0 s — inference.log: ")
    assert first.rstrip().endswith("Loading weights took 0.12 seconds")
    with log.open("a") as f:
        f.write("INFO 12-06 09:41:30 [gpu_model_runner.py:2] Graph capturing finished in 12 secs\n")
    second = waiting.stdout.readline()
    assert second.rstrip().endswith("inference.log: Graph capturing finished in 12 secs")
    ready.set()
    assert waiting.wait(10) == 0


def test_the_wait_ends_when_a_process_of_the_demo_dies_or_time_runs_out(health_server):
    url, _ = health_server
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    waiting = wait_ready(url, "60", "the inference server", str(dead.pid), "--every", "0.3")
    assert waiting.wait(10) == 1
    assert "a process of the demo exited while waiting for the inference server" in waiting.stderr.read()

    late = wait_ready(url, "1", "the web server", "--every", "0.3")
    assert late.wait(10) == 1
    assert f"the web server did not answer {url} within 1 s" in late.stderr.read()
    assert "waiting for the web server: 0 s" in late.stdout.read()  # no log: the time alone


@pytest.mark.django_db
def test_an_empty_trace_list_says_the_demo_agent_is_starting_under_make_demo(client, settings):
    client.force_login(user_with_role("operator", "olga"))
    deployment = DeploymentFactory(name="support-bot")
    settings.DEMO_EPISODES = 12
    for query in ({}, {"deployment": deployment.pk}):  # the tour links to the deployment's list
        html = client.get(reverse("feedback:trace-list"), query).content.decode()
        assert "The demo agent is starting" in html and "POST /api/v1/traces" not in html

    settings.DEMO_EPISODES = 0  # not a demo: an empty list asks for traces
    html = client.get(reverse("feedback:trace-list")).content.decode()
    assert "The demo agent is starting" not in html and "Send some with <code>POST /api/v1/traces</code>" in html

    settings.DEMO_EPISODES = 12  # the agent's first episode has arrived: a filter that matches none says so
    TraceFactory(deployment=deployment, source="gateway")
    html = client.get(reverse("feedback:trace-list"), {"status": "error"}).content.decode()
    assert "The demo agent is starting" not in html and "No traces match." in html
