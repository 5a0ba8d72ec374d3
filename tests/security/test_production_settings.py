"""PRACTICUM_PRODUCTION=1 turns on the settings `manage.py check --deploy` asks for; the API
schema is for authenticated callers; every page carries the Content-Security-Policy."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.factories import DeploymentFactory, user_with_role

ROOT = Path(__file__).resolve().parents[2]


def check_deploy(**env: str) -> subprocess.CompletedProcess:
    # DJANGO_ALLOW_ASYNC_UNSAFE is the browser tests' (playwright's loop in the test thread),
    # never a deployment's: the check rightly refuses it, so it is not passed on.
    drop = ("DEBUG", "SECRET_KEY", "PRACTICUM_PRODUCTION", "DJANGO_ALLOW_ASYNC_UNSAFE")
    base = {k: v for k, v in os.environ.items() if k not in drop}
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_check_deploy_is_clean_under_the_production_switch():
    done = check_deploy(PRACTICUM_PRODUCTION="1", SECRET_KEY=secrets.token_urlsafe(50))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "System check identified no issues (0 silenced)" in done.stdout


def test_without_the_switch_check_deploy_names_what_is_missing():
    done = check_deploy(SECRET_KEY=secrets.token_urlsafe(50))
    assert done.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in done.stderr


def test_the_production_switch_refuses_debug_and_a_missing_secret_key():
    debug = check_deploy(PRACTICUM_PRODUCTION="1", SECRET_KEY=secrets.token_urlsafe(50), DEBUG="1")
    assert debug.returncode != 0 and "turn DEBUG off" in debug.stderr
    keyless = check_deploy(PRACTICUM_PRODUCTION="1")
    assert keyless.returncode != 0 and "needs SECRET_KEY" in keyless.stderr


@pytest.mark.django_db
def test_the_api_schema_needs_a_login_or_a_key(client, make_key):
    assert client.get("/api/schema/").status_code in (401, 403)
    key = make_key(DeploymentFactory(), ["read"])
    assert client.get("/api/schema/", HTTP_AUTHORIZATION=f"Bearer {key}").status_code == 200
    client.force_login(user_with_role("operator", "olga"))
    response = client.get("/api/schema/")
    assert response.status_code == 200 and b"/api/v1/traces" in response.content


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    ["/", "/tour/", "/overview/", "/training/jobs/", "/models/", "/login/", "/admin/", "/admin/login/", "/nope/"],
)
def test_every_page_sends_the_content_security_policy(client, path):
    from webapp.kernel.csp import CSP

    client.force_login(user_with_role("admin", "ada", is_staff=True))
    response = client.get(path)
    assert response.status_code < 500
    assert response["Content-Security-Policy"] == CSP
    assert "script-src 'self'" in CSP and "frame-ancestors 'none'" in CSP
