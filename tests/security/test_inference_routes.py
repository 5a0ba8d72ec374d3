"""Every route of the inference server but its health check needs the server's key, on
every server the project starts (`ServerSpec`): vLLM's own `--api-key` guards only paths
under /v1, /v2, /inference and /cohere, and its SageMaker routes (`POST /adapters`,
`DELETE /adapters/{name}`, `POST /invocations`) would otherwise let anyone who reaches the
port swap or drop the adapter behind a live name.

The routes are those of vLLM's app built from the very command line the server runs, not
a list written here: a route a later vLLM adds is checked too."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import shutil
import subprocess
import sys

import httpx
import pytest

# Builds vLLM's FastAPI app the way its server does (its argument parser over the server's
# own arguments, then `build_app`) and prints every route as [method, path].
_ROUTES_SCRIPT = r"""
import json, sys
from starlette.routing import Mount, WebSocketRoute
from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser

args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[2:])
app = build_app(args, supported_tasks=tuple(json.loads(sys.argv[1])))
routes = []
for route in app.routes:
    if isinstance(route, Mount):
        routes.append(["GET", route.path + "/"])
    elif isinstance(route, WebSocketRoute):
        routes.append(["WEBSOCKET", route.path])
    else:
        routes += [[method, route.path] for method in sorted(route.methods or ["GET"])]
print(json.dumps({"routes": routes, "middleware": [m.cls.__name__ for m in app.user_middleware]}))
"""


def served_routes(spec, tasks: tuple[str, ...] = ("generate",)) -> dict:
    """The routes (and middleware) of the app the server `spec` starts, built in a process
    of its own with the server's arguments and environment."""
    argv, env = spec.command()
    module = argv.index("vllm.entrypoints.openai.api_server")
    done = subprocess.run(
        [sys.executable, "-c", _ROUTES_SCRIPT, json.dumps(tasks), *argv[module + 1 :]],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _run(coro):
    """Runs a coroutine on a thread of its own: a browser test earlier in the session can
    leave an event loop running on the main thread, where `asyncio.run` refuses to start."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _call(url: str, method: str, path: str, headers: dict[str, str]) -> int:
    body = None if method in ("GET", "HEAD", "DELETE", "OPTIONS") else b"{}"
    sent = {**headers, "Content-Type": "application/json"} if body is not None else headers
    return httpx.request(method, f"{url}{path}", content=body, headers=sent, timeout=60).status_code


def _websocket_refused(url: str, path: str) -> bool:
    """A websocket handshake without the key is refused (403 before it is accepted)."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    host, port = url.removeprefix("http://").split(":")

    async def handshake() -> bytes:
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request.encode())
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 30)
        writer.close()
        return line

    return b" 101 " not in _run(handshake())


def _guarded(key: str = "k-1"):
    from training.inference.server_auth import KeyGuard

    async def app(scope, receive, send):
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"served"})

    return KeyGuard(app, key=key)


def _ask(guard, method: str, path: str, headers: dict[str, str] | None = None) -> int:
    async def go() -> int:
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://inference") as client:
            return (await client.request(method, path, headers=headers or {})).status_code

    return _run(go())


def test_the_key_guard_opens_the_health_check_alone():
    guard = _guarded()
    assert _ask(guard, "GET", "/health") == 200
    for method, path in [
        ("POST", "/adapters"),
        ("DELETE", "/adapters/support-bot-v2"),
        ("POST", "/invocations"),
        ("POST", "/scale_elastic_ep"),
        ("GET", "/metrics"),
        ("GET", "/health/"),
        ("POST", "/health"),
        ("OPTIONS", "/v1/models"),
        ("GET", "/a-route-a-later-vllm-adds"),
    ]:
        assert _ask(guard, method, path) == 401, (method, path)
        assert _ask(guard, method, path, {"Authorization": "Bearer k-2"}) == 401
        assert _ask(guard, method, path, {"Authorization": "Basic k-1"}) == 401
        assert _ask(guard, method, path, {"Authorization": "k-1"}) == 401
        assert _ask(guard, method, path, {"Authorization": "Bearer k-1"}) == 200
        assert _ask(guard, method, path, {"authorization": "bearer k-1"}) == 200


def test_the_key_guard_closes_a_websocket_without_the_key_and_passes_lifespan():
    guard = _guarded()
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "websocket.connect"}

    _run(guard({"type": "websocket", "path": "/v1/realtime", "headers": []}, receive, send))
    assert sent == [{"type": "websocket.close", "code": 1008}]
    _run(guard({"type": "lifespan"}, receive, send))  # reaches the app, which ignores it
    assert len(sent) == 1


def test_the_key_guard_reads_the_servers_key_and_refuses_to_run_without_one(monkeypatch):
    from training.inference.server_auth import KeyGuard

    monkeypatch.setenv("VLLM_API_KEY", "from-env")
    guard = KeyGuard(_guarded().app)
    assert _ask(guard, "POST", "/adapters", {"Authorization": "Bearer from-env"}) == 200
    monkeypatch.setenv("VLLM_API_KEY", "")
    with pytest.raises(RuntimeError, match="does not start without its key"):
        KeyGuard(_guarded().app)


def test_every_server_the_project_starts_loads_the_key_guard_outermost(tmp_path):
    from training.inference.server import ServerSpec
    from training.services.inference import server_spec_for_base
    from training.serving.models import BaseModel

    specs = [
        ServerSpec(model_path=str(tmp_path), served_name="m", extra_args=["--middleware", "other.Middleware"]),
        server_spec_for_base(BaseModel(name="m", path=str(tmp_path)), port=8002),  # serve_inference's replicas
    ]
    for spec in specs:
        argv, env = spec.command()
        assert argv[-2:] == ["--middleware", "training.inference.server_auth.KeyGuard"]
        # Importable by the server process from any folder, and without Django.
        done = subprocess.run(
            [sys.executable, "-c", "import sys, training.inference.server_auth; print('django' in sys.modules)"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "False"


def test_a_server_that_answers_without_the_key_gets_no_live_adapters(db, tmp_path):
    """A replica started as a plain vLLM server (no key guard) is refused before it is listed."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    from tests.security.conftest import recording_server
    from training.serving.services import base_model_register

    (tmp_path / "config.json").write_text("{}")
    base_model_register(name="smol", path=tmp_path, inference_url="http://127.0.0.1:8001")
    server, seen = recording_server(status=200, body=b'{"version": "0.32.0"}')
    try:
        url = f"http://127.0.0.1:{server.server_port}"
        with pytest.raises(CommandError, match="answers GET /version without the inference key"):
            call_command("inference_replicas", "smol", url)
    finally:
        server.shutdown()
    assert seen == [{"path": "/version", "authorization": ""}]


@pytest.mark.vllm
@pytest.mark.slow
def test_every_route_of_the_served_app_but_the_health_check_needs_the_key(vllm_server):
    built = served_routes(vllm_server.server.spec)
    routes = {tuple(r) for r in built["routes"]}
    # The enumeration is the served app's: the routes the issue found open are in it, and
    # every route the running server documents is in it.
    assert {("POST", "/adapters"), ("DELETE", "/adapters/{adapter_name}"), ("POST", "/invocations")} <= routes
    schema = httpx.get(f"{vllm_server.url}/openapi.json", headers=vllm_server.headers, timeout=60).json()
    documented = {(m.upper(), p) for p, ops in schema["paths"].items() for m in ops}
    assert documented <= routes, documented - routes

    wrong = {"Authorization": "Bearer not-the-key"}
    basic = {"Authorization": f"Basic {vllm_server.api_key}"}
    opened, refused_with_key = [], []
    for method, template in sorted(routes):
        path = template.replace("{adapter_name}", "tiny-live").replace("{response_id}", "resp-1")
        if method == "WEBSOCKET":
            assert _websocket_refused(vllm_server.url, path), path
            continue
        if (method, path) in (("GET", "/health"), ("HEAD", "/health")):
            assert _call(vllm_server.url, method, path, {}) == 200
            continue
        for headers in ({}, wrong, basic):
            if _call(vllm_server.url, method, path, headers) != 401:
                opened.append((method, path, headers.get("Authorization", "no key")))
        # With the key every route answers as its own handler does (a 4xx about the empty
        # body at most): the key opens each door.
        if _call(vllm_server.url, method, path, vllm_server.headers) == 401:
            refused_with_key.append((method, path))
    assert opened == [], f"answered without the key: {opened}"
    assert refused_with_key == []
    for path in ("/version", "/metrics", "/ping", "/load", "/v1/models", "/openapi.json", "/docs"):
        assert httpx.get(f"{vllm_server.url}{path}", headers=vllm_server.headers, timeout=60).status_code == 200, path
    assert _call(vllm_server.url, "OPTIONS", "/adapters", {}) == 401


@pytest.mark.vllm
@pytest.mark.slow
def test_the_adapter_routes_without_the_key_cannot_drop_or_swap_a_live_adapter(
    vllm_server, tool_call_adapter_path, tmp_path
):
    """The issue's attack, replayed against the server started the project's way: a live
    adapter, then DELETE /adapters/<it> and POST /adapters over its name without the key."""
    client = vllm_server.client()
    other = shutil.copytree(tool_call_adapter_path, tmp_path / "other-adapter")
    live = "tiny-live"
    client.adapter_load(live, tool_call_adapter_path)
    question = [{"role": "user", "content": "Where is my order A1001?"}]
    try:
        before = client.chat(model=live, messages=question, max_tokens=24, temperature=0.0)
        url = vllm_server.url
        assert httpx.delete(f"{url}/adapters/{live}", timeout=60).status_code == 401
        assert httpx.post(f"{url}/adapters", json={"name": live, "src": str(other)}, timeout=60).status_code == 401
        assert httpx.post(f"{url}/adapters", json={"name": "extra", "src": str(other)}, timeout=60).status_code == 401
        chat = {"model": live, "messages": question, "max_tokens": 4}
        assert httpx.post(f"{url}/invocations", json=chat, timeout=60).status_code == 401

        served = {m.id for m in client.models()}
        assert live in served and "extra" not in served
        after = client.chat(model=live, messages=question, max_tokens=24, temperature=0.0)
        assert (after.content, after.tool_calls, after.token_ids) == (
            before.content,
            before.tool_calls,
            before.token_ids,
        )

        # With the key the same routes work (they are vLLM's; the key is what they lacked).
        assert httpx.post(f"{url}/invocations", json=chat, headers=vllm_server.headers, timeout=120).status_code == 200
        loaded = httpx.post(
            f"{url}/adapters", json={"name": "extra", "src": str(other)}, headers=vllm_server.headers, timeout=120
        )
        assert loaded.status_code == 200, loaded.text
        assert "extra" in {m.id for m in client.models()}
        assert httpx.delete(f"{url}/adapters/extra", headers=vllm_server.headers, timeout=60).status_code == 200
        assert "extra" not in {m.id for m in client.models()}
    finally:
        client.adapter_unload("extra")
        client.adapter_unload(live)
