"""Concurrent batch ingest on PostgreSQL, through real concurrent HTTP requests to a
threaded server: identical batches, appends racing on one trace, a bad external id."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from feedback.models import Message, Trace
from feedback.services.api_keys import api_key_create
from tests.factories import DeploymentFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
THREADS = 8


def conversation(n: int) -> list[dict]:
    out = [{"role": "system", "content": "You are Acme's support agent."}]
    for k in range(1, n):
        out.append({"role": "user" if k % 2 else "assistant", "content": f"message {k}"})
    return out


@pytest.fixture
def post(live_server):
    deployment = DeploymentFactory(name="racing")
    key = api_key_create(deployment=deployment, scopes=["ingest"]).plaintext

    def send_all(bodies: list[dict]) -> list[httpx.Response]:
        """POST every body at the same moment, one thread each."""
        start = threading.Barrier(len(bodies))

        def send(body: dict) -> httpx.Response:
            with httpx.Client(base_url=live_server.url, timeout=60) as client:
                start.wait()
                return client.post("/api/v1/traces", json=body, headers={"Authorization": f"Bearer {key}"})

        with ThreadPoolExecutor(len(bodies)) as pool:
            return list(pool.map(send, bodies))

    return send_all


def test_identical_batches_sent_at_once_store_each_trace_once_and_never_fail(post):
    batch = {"traces": [{"external_id": f"same-{i}", "messages": conversation(4)} for i in range(10)]}
    for _ in range(3):
        responses = post([batch] * THREADS)
        assert [r.status_code for r in responses] == [207] * THREADS, [r.text[:300] for r in responses]
        statuses = [item["status"] for r in responses for item in r.json()["results"]]
        assert set(statuses) <= {"created", "exists"}
    created = [item["external_id"] for r in responses for item in r.json()["results"] if item["status"] == "created"]
    assert len(created) == len(set(created))
    assert Trace.objects.filter(deployment__name="racing").count() == 10
    assert Message.objects.filter(trace__deployment__name="racing").count() == 40


def test_appends_racing_on_one_trace_keep_its_message_count_exact(post):
    assert post([{"traces": [{"external_id": "growing", "messages": conversation(2)}]}])[0].status_code == 207
    # Each client resends the conversation as far as it has got: different lengths, same prefix.
    bodies = [{"traces": [{"external_id": "growing", "messages": conversation(3 + k)}]} for k in range(THREADS)]
    for round_ in range(2):
        if round_:
            bodies = [
                {"traces": [{"external_id": "growing", "messages": conversation(20 + k)}]} for k in range(THREADS)
            ]
        responses = post(bodies)
        assert [r.status_code for r in responses] == [207] * THREADS, [r.text[:300] for r in responses]
        for r in responses:
            assert r.json()["results"][0]["status"] in {"appended", "exists"}, r.text[:300]
    trace = Trace.objects.get(external_id="growing")
    stored = list(trace.messages.order_by("position").values_list("position", "content"))
    assert [p for p, _ in stored] == list(range(20 + THREADS - 1))
    assert trace.message_count == len(stored) == 20 + THREADS - 1
    assert [c for _, c in stored] == [m["content"] for m in conversation(20 + THREADS - 1)]


def test_a_nul_in_one_external_id_fails_that_item_only(post):
    batch = {
        "traces": [
            {"external_id": "fine-1", "messages": conversation(2)},
            {"external_id": "bad\x00id", "messages": conversation(2)},
            {"external_id": "fine-2", "messages": conversation(2), "session_id": "s\x00"},
            {"external_id": "fine-3", "messages": conversation(2)},
        ]
    }
    (response,) = post([batch])
    assert response.status_code == 207, response.text[:300]
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["created", "error", "error", "created"]
    assert results[1]["errors"] == [{"field": "external_id", "reason": "contains a NUL character"}]
    assert results[2]["errors"] == [{"field": "session_id", "reason": "contains a NUL character"}]
    assert set(Trace.objects.values_list("external_id", flat=True)) == {"fine-1", "fine-3"}
