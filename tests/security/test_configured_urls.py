"""Server-side calls go to configured addresses only: the tour's "run the agent again"
sends a freshly minted key to PRACTICUM_GATEWAY_URL, whatever Host the request named."""

from __future__ import annotations

import http.server
import threading

import pytest

from tests.factories import DeploymentFactory, user_with_role

pytestmark = pytest.mark.django_db


def recording_server():
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            seen.append({"path": self.path, "authorization": self.headers.get("Authorization", "")})
            body = b'{"error": {"message": "no", "type": "invalid_api_key"}}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_run_the_agent_again_sends_the_key_to_the_configured_gateway_not_to_the_host_header(
    client, settings, django_capture_on_commit_callbacks
):
    from webapp.celery import app

    attacker, to_attacker = recording_server()
    gateway, to_gateway = recording_server()
    settings.GATEWAY_URL = f"http://127.0.0.1:{gateway.server_port}"
    settings.DEMO_AGENT_BASE_URL = ""  # the older setting, where it still exists: unset
    DeploymentFactory(name="support-bot")
    client.force_login(user_with_role("operator", "olga"))
    eager = app.conf.task_always_eager
    app.conf.task_always_eager = True
    try:
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(
                "/tour/support-bot/agent-run",
                {"episodes": "1"},
                HTTP_HOST=f"127.0.0.1:{attacker.server_port}",  # ALLOWED_HOSTS does not check the port
            )
    finally:
        app.conf.task_always_eager = eager
        attacker.shutdown()
        gateway.shutdown()
    assert response.status_code == 302
    assert to_attacker == []
    assert to_gateway and all(r["authorization"].startswith("Bearer prk_") for r in to_gateway)
