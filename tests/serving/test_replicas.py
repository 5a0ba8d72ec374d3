"""A base model's replicas: what is accepted and refused, the one list every reader uses, the
commands that fill it, and the gateway's route over it."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from feedback.gateway.access import _route_sync
from tests.factories import DeploymentFactory
from training.serving.models import BaseModel
from training.serving.selectors import base_model_replica_urls
from training.serving.services import (
    ModelRegistryError,
    base_model_register,
    base_model_replicas_set,
    live_version_set,
)


@pytest.fixture
def base(db, tmp_path) -> BaseModel:
    (tmp_path / "config.json").write_text("{}")
    base, _ = base_model_register(name="smol", path=tmp_path, inference_url="http://127.0.0.1:8001")
    return base


def test_the_inference_url_is_the_first_replica_and_each_server_counts_once(base, settings):
    assert base_model_replica_urls(base=base) == ["http://127.0.0.1:8001"]
    base_model_replicas_set(base=base, urls=["http://127.0.0.1:8002/v1", "http://gpu2:8001"])
    base.refresh_from_db()
    assert base_model_replica_urls(base=base) == ["http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://gpu2:8001"]
    base.inference_url = ""
    settings.INFERENCE_URL = "http://127.0.0.1:8002"
    # A blank inference_url is the site's server, here one of the replicas: listed once.
    assert base_model_replica_urls(base=base) == ["http://127.0.0.1:8002", "http://gpu2:8001"]


@pytest.mark.parametrize(
    ("urls", "field", "reason"),
    [
        (["https://gpu2:8001"], "inference_replicas[0]", "an http://host:port URL"),
        (["http://gpu2:8001", "http://gpu2:8001/"], "inference_replicas[1]", "listed twice"),
        (["http://gpu2:8001", "HTTP://GPU2:8001"], "inference_replicas[1]", "listed twice"),
        (["http://LOCALHOST:9/", "http://localhost:9"], "inference_replicas[1]", "listed twice"),
        (["http://127.0.0.1:8001/v1"], "inference_replicas[0]", "the base model's inference_url"),
        (["http://gpu2:port"], "inference_replicas[0]", "is not a URL"),
        (["http://user:pw@gpu2:8001"], "inference_replicas[0]", "only scheme, host, port and path"),
        (["gpu2:8001"], "inference_replicas[0]", "an http://host:port URL"),
        ([""], "inference_replicas[0]", "a non-empty URL string"),
        ([8002], "inference_replicas[0]", "a non-empty URL string"),
        ("http://gpu2:8001", "inference_replicas", "a list of URLs"),
    ],
)
def test_a_bad_replica_list_is_refused_naming_the_entry_and_nothing_is_stored(base, urls, field, reason):
    base_model_replicas_set(base=base, urls=["http://gpu3:8001"])
    with pytest.raises(ModelRegistryError) as caught:
        base_model_replicas_set(base=base, urls=urls)
    assert caught.value.status == 400
    assert caught.value.field == field and reason in caught.value.reason
    base.refresh_from_db()
    assert base.inference_replicas == ["http://gpu3:8001"]


def test_the_command_sets_lists_and_clears_the_replicas(base, capsys):
    call_command("inference_replicas", "smol", "http://gpu2:8001", "http://gpu3:8001")
    assert capsys.readouterr().out.split() == ["http://127.0.0.1:8001", "http://gpu2:8001", "http://gpu3:8001"]
    with pytest.raises(CommandError, match=r"inference_replicas\[0\]: 'https://x:1'"):
        call_command("inference_replicas", "smol", "https://x:1")
    call_command("inference_replicas", "smol", "--clear")
    assert capsys.readouterr().out.split() == ["http://127.0.0.1:8001"]
    base.refresh_from_db()
    assert base.inference_replicas == []


def test_serve_inference_prints_one_server_per_replica_on_consecutive_ports(base, capsys):
    call_command(
        "serve_inference", "--base", "smol", "--print-command", "--port", "8001", "--replicas", "2",
        "--tensor-parallel-size", "2",
    )  # fmt: skip
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    assert "--port 8001" in lines[0] and "--port 8002" in lines[1]
    assert all("--tensor-parallel-size 2" in line for line in lines)
    base.refresh_from_db()
    assert base.inference_replicas == []  # printing records nothing


def test_the_gateways_route_lists_every_replica(base):
    deployment = DeploymentFactory(name="bot")
    live_version_set(deployment=deployment, version=base.versions.get(name="smol"))
    base_model_replicas_set(base=base, urls=["http://gpu2:8001"])
    route = _route_sync(deployment.pk)
    assert route.version_name == "smol"
    assert route.upstream_urls == ("http://127.0.0.1:8001", "http://gpu2:8001")


def test_cpu_replicas_each_bind_to_their_own_cpus(monkeypatch):
    from training.inference import server

    monkeypatch.setattr(server.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert server.cpu_shares(2) == ["0-1", "2-3"]
    assert server.cpu_shares(5) == ["0", "1", "2", "3", "4"]
    # Fewer CPUs than servers, or one server: vLLM's own binding for all.
    assert server.cpu_shares(6) == [] and server.cpu_shares(1) == []


def test_serve_inference_takes_its_replicas_off_the_list_when_one_gives_up_and_when_it_stops(base, monkeypatch):
    # Left listed, a stopped replica would be probed by every gateway process forever and
    # fail every release of the base model ("cannot connect … at http://127.0.0.1:8002").
    from training.management.commands import serve_inference as command_module

    seen = {}

    def supervise_all(servers, *, on_ready, on_gave_up, max_restarts, ready_timeout):
        base.refresh_from_db()
        seen["running"] = list(base.inference_replicas)
        on_gave_up(servers[1])
        base.refresh_from_db()
        seen["after_give_up"] = list(base.inference_replicas)
        base_model_replicas_set(base=base, urls=[*base.inference_replicas, "http://gpu9:8001"])  # someone else's
        return 0

    monkeypatch.setattr(command_module, "vllm_missing_reason", lambda: None)
    monkeypatch.setattr(command_module, "supervise_all", supervise_all)
    call_command("serve_inference", "--base", "smol", "--port", "8001", "--replicas", "3")
    assert seen["running"] == ["http://127.0.0.1:8002", "http://127.0.0.1:8003"]
    assert seen["after_give_up"] == ["http://127.0.0.1:8003"]
    base.refresh_from_db()
    assert base.inference_replicas == ["http://gpu9:8001"]


def test_serve_inference_without_replicas_says_which_recorded_ones_it_does_not_start(base, monkeypatch, capsys):
    from training.management.commands import serve_inference as command_module

    base_model_replicas_set(base=base, urls=["http://127.0.0.1:8002"])
    monkeypatch.setattr(command_module, "vllm_missing_reason", lambda: None)
    monkeypatch.setattr(command_module, "supervise_all", lambda servers, **kw: 0)
    call_command("serve_inference", "--base", "smol", "--port", "8001")
    assert "also lists the replicas http://127.0.0.1:8002" in capsys.readouterr().err


def _adapter_server(status: int):
    """An inference server that answers every call with `status`; the requests it saw."""
    import http.server
    import json
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append((self.path, json.loads(raw) if raw else None))
            body = b"{}" if status == 200 else b'{"error": {"message": "engine down"}}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}", seen


def test_a_replica_the_command_adds_gets_the_live_adapters_before_it_is_listed(base, tmp_path):
    from tests.promotion.conftest import make_adapter_folder
    from training.serving.services import model_version_create

    version = model_version_create(
        name="smol-v1", base_model=base, kind="lora", path=make_adapter_folder(tmp_path / "v1"),
        parent=base.versions.get(name="smol"),
    )  # fmt: skip
    live_version_set(deployment=DeploymentFactory(name="bot"), version=version)
    broken, broken_url, _ = _adapter_server(500)
    try:
        with pytest.raises(CommandError, match="could not load the live adapters, nothing recorded"):
            call_command("inference_replicas", "smol", broken_url)
        base.refresh_from_db()
        assert base.inference_replicas == []
    finally:
        broken.shutdown()
    server, url, seen = _adapter_server(200)
    try:
        call_command("inference_replicas", "smol", url)
    finally:
        server.shutdown()
    assert [(path, body["lora_name"]) for path, body in seen] == [("/v1/load_lora_adapter", "smol-v1")]
    base.refresh_from_db()
    assert base.inference_replicas == [url]
