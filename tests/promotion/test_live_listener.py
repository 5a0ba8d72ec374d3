"""The gateway hears a live-pointer flip at once (PostgreSQL NOTIFY) instead of serving the
old version until its cached route expires."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from feedback.gateway.access import Access, Principal
from tests.factories import DeploymentFactory
from tests.promotion.conftest import make_adapter_folder

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _run(coroutine):
    """Run a coroutine on its own thread: a session-scoped browser (Playwright's sync API) keeps
    an event loop running on the main thread, where `asyncio.run` refuses to start another."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def test_a_flip_reaches_a_gateway_with_a_long_cache_at_once(tmp_path):
    from training.serving.services import base_model_register, live_version_set, model_version_create

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    base, base_version = base_model_register(name="smol", path=tmp_path / "base")
    v1 = model_version_create(
        name="smol-v1", base_model=base, kind="lora", path=make_adapter_folder(tmp_path / "v1"), parent=base_version
    )
    deployment = DeploymentFactory(name="support-bot")
    live_version_set(deployment=deployment, version=base_version)
    principal = Principal(key_id=1, deployment_id=deployment.pk, deployment_name="support-bot", scopes=frozenset())

    access = Access(auth_ttl=60, route_ttl=60)  # without the listener, a flip would wait a minute
    listener = access.listen()
    try:
        assert listener.listening.wait(10)
        assert _run(access.route(principal)).version_name == "smol"
        live_version_set(deployment=deployment, version=v1)  # commits: NOTIFY is delivered
        deadline = time.monotonic() + 5
        while access.routes.get(deployment.pk)[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _run(access.route(principal)).version_name == "smol-v1"
        # A flip that rolls back is never announced: the cached route stays.
        from django.db import transaction

        with pytest.raises(RuntimeError), transaction.atomic():
            live_version_set(deployment=deployment, version=base_version)
            raise RuntimeError("abandoned")
        time.sleep(0.3)
        hit, route = access.routes.get(deployment.pk)
        assert hit and route.version_name == "smol-v1"
    finally:
        access.close()
    assert not listener.listening.is_set()
