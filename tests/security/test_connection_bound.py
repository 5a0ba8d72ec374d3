"""Many concurrent clients never open more database connections than the process's pool:
the ASGI application (as uvicorn runs it) lets a bounded number of Django requests run at
once and the rest wait, so a burst of clients gets answers, not 500s."""

from __future__ import annotations

import asyncio
import threading

import httpx
import psycopg
import pytest
from django.conf import settings
from django.db import connection

from feedback.models import Trace
from feedback.services.api_keys import api_key_create
from tests.factories import DeploymentFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
CLIENTS = 40


def test_a_burst_of_clients_is_served_within_the_connection_pool():
    from webapp.asgi import application

    key = api_key_create(deployment=DeploymentFactory(name="burst"), scopes=["ingest"]).plaintext
    database = connection.settings_dict["NAME"]
    params = {k: v for k, v in connection.get_connection_params().items() if k in ("host", "port", "user", "password")}
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
            while not stop.wait(0.02):
                (n,) = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [database]).fetchone()
                peak = max(peak, n)

    async def burst() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver", timeout=120) as client:

            async def post(n: int) -> httpx.Response:
                traces = [
                    {"external_id": f"b-{n}-{i}", "messages": [{"role": "user", "content": f"hello {n} {i}"}]}
                    for i in range(5)
                ]
                return await client.post(
                    "/api/v1/traces", json={"traces": traces}, headers={"Authorization": f"Bearer {key}"}
                )

            return await asyncio.gather(*(post(n) for n in range(CLIENTS)))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    responses: list[httpx.Response] = []
    # A loop of its own in a thread of its own: this thread may already run one (a browser
    # test's driver, earlier in the session).
    runner = threading.Thread(target=lambda: responses.extend(asyncio.run(burst())))
    try:
        runner.start()
        runner.join()
    finally:
        stop.set()
        watcher.join()
    assert [r.status_code for r in responses] == [207] * CLIENTS
    assert Trace.objects.filter(deployment__name="burst").count() == CLIENTS * 5
    # The pool's connections (plus this test's own), however many clients came at once.
    assert peak <= getattr(settings, "DB_POOL_MAX_SIZE", 10) + 1, peak
