"""Server-side calls go to configured addresses only: the tour's "run the agent again"
sends a freshly minted key to PRACTICUM_GATEWAY_URL, whatever Host the request named."""

from __future__ import annotations

import pytest

from tests.factories import DeploymentFactory, user_with_role
from tests.security.conftest import recording_server

pytestmark = pytest.mark.django_db


def test_run_the_agent_again_sends_the_key_to_the_configured_gateway_not_to_the_host_header(
    client, settings, django_capture_on_commit_callbacks
):
    from webapp.celery import app

    refused = b'{"error": {"message": "no", "type": "invalid_api_key"}}'
    attacker, to_attacker = recording_server(status=401, body=refused)
    gateway, to_gateway = recording_server(status=401, body=refused)
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
