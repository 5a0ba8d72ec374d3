"""The one inference client's error kinds and retry rule, against a real HTTP server that
answers from a script (status, body) and counts what it was sent."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from training.inference.client import (
    InferenceBadAnswer,
    InferenceClient,
    InferenceRefused,
    InferenceUnavailable,
    server_root,
)
from training.inference.server import free_port

MODELS = json.dumps({"object": "list", "data": [{"id": "tiny", "root": "/m/tiny", "parent": None}]}).encode()
CHAT = json.dumps(
    {
        "id": "c1",
        "model": "tiny",
        "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop", "token_ids": [5]}],
    }
).encode()


@pytest.fixture
def scripted():
    """`scripted(*answers)` -> (client, seen): the server gives the answers in turn (the last
    one again when they run out) and records (method, path, body) of each request."""
    servers = []

    def start(*answers: tuple[int, bytes]):
        seen: list[tuple[str, str, dict | None]] = []
        queue = list(answers)

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                seen.append((self.command, self.path, json.loads(raw) if raw else None))
                status, body = queue.pop(0) if len(queue) > 1 else queue[0]
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return InferenceClient(f"http://127.0.0.1:{server.server_port}/v1", api_key="k", timeout=5), seen

    yield start
    for server in servers:
        server.shutdown()


def error(status: int, message: str) -> tuple[int, bytes]:
    return status, json.dumps({"error": {"message": message, "type": "BadRequestError", "code": status}}).encode()


def test_an_unavailable_server_is_tried_again_with_backoff_and_then_answers(scripted):
    client, seen = scripted(error(503, "starting"), (502, b"bad gateway"), (200, MODELS))
    started = time.monotonic()
    assert [m.id for m in client.models()] == ["tiny"]
    assert len(seen) == 3 and all(s[1] == "/v1/models" for s in seen)
    assert time.monotonic() - started >= 1.5  # waited 0.5 s, then 1 s


def test_a_server_that_stays_unavailable_fails_after_the_bounded_retries(scripted):
    client, seen = scripted(error(503, "overloaded"))
    with pytest.raises(InferenceUnavailable) as info:
        client.models()
    assert len(seen) == 3  # one try and `retries` (2) more
    assert info.value.status == 503 and "overloaded" in str(info.value)


def test_a_refusal_and_a_bad_answer_are_final(scripted):
    client, seen = scripted(error(400, "max_tokens must be at least 1"))
    with pytest.raises(InferenceRefused, match="max_tokens must be at least 1"):
        client.models()
    assert len(seen) == 1
    client, seen = scripted((500, b"Internal Server Error"))
    with pytest.raises(InferenceBadAnswer) as info:
        client.models()
    assert len(seen) == 1 and info.value.status == 500
    client, seen = scripted((200, b"<html>not the server</html>"))
    with pytest.raises(InferenceBadAnswer, match="not JSON"):
        client.models()


def test_a_completion_is_not_repeated_unless_the_caller_says_so(scripted):
    client, seen = scripted(error(503, "busy"), (200, CHAT))
    with pytest.raises(InferenceUnavailable):
        client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert len(seen) == 1
    client, seen = scripted(error(503, "busy"), (200, CHAT))
    result = client.chat(model="tiny", messages=[{"role": "user", "content": "hi"}], retries=1)
    assert (result.content, result.token_ids, len(seen)) == ("hi", [5], 2)


def test_nothing_listening_is_unavailable():
    client = InferenceClient(f"http://127.0.0.1:{free_port()}", api_key="k", retries=0)
    with pytest.raises(InferenceUnavailable) as info:
        client.models()
    assert info.value.status is None and not info.value.timed_out
    assert client.health() is False


def test_adapters_load_and_unload_by_name_idempotently(scripted):
    client, seen = scripted(error(400, "The lora adapter 'v2' has already been loaded."))
    client.adapter_load("v2", "/adapters/v2")  # a retried release step: the name stands for fixed weights
    assert seen == [("POST", "/v1/load_lora_adapter", {"lora_name": "v2", "lora_path": "/adapters/v2"})]
    # New weights under a name that is already loaded must not be served as the old ones.
    with pytest.raises(InferenceRefused, match="already been loaded"):
        client.adapter_load("v2", "/adapters/v2", fresh=True)
    client, seen = scripted(error(404, "The lora adapter 'v3' cannot be found."))
    client.adapter_unload("v3")
    assert seen == [("POST", "/v1/unload_lora_adapter", {"lora_name": "v3"})]


def test_a_server_is_named_by_its_root_url():
    assert server_root("http://10.0.0.5:8001/v1/") == server_root("http://10.0.0.5:8001") == "http://10.0.0.5:8001"
    assert InferenceClient("http://10.0.0.5:8001/v1", api_key="").url == "http://10.0.0.5:8001"
    with pytest.raises(ValueError, match="line break"):
        InferenceClient("http://10.0.0.5:8001", api_key="k\r\nx-injected: 1")
