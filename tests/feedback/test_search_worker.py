"""Search vectors are built by a real worker after ingest commits."""

from __future__ import annotations

import json
import time

import pytest

from feedback.services.search import traces_search_index_missing
from tests.factories import user_with_role

pytestmark = [pytest.mark.postgres]


@pytest.mark.redis
@pytest.mark.django_db(transaction=True)
def test_a_trace_sent_through_the_api_becomes_searchable(client, deployment, make_key, celery_worker_process):
    key = make_key(deployment, ["ingest"])
    body = {
        "traces": [
            {"external_id": "zz-1", "messages": [{"role": "user", "content": "My toaster exploded"}]},
            {"external_id": "zz-2", "messages": [{"role": "user", "content": "Where is my kettle?"}]},
        ]
    }
    response = client.post(
        "/api/v1/traces", data=json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}"
    )
    assert response.status_code == 207
    client.force_login(user_with_role("operator", "olga"))
    deadline = time.monotonic() + 30
    while b"zz-1" not in (page := client.get("/traces/", {"q": "toasters"})).content:
        assert time.monotonic() < deadline, "the worker did not index the trace within 30 s"
        time.sleep(0.3)
    assert b"zz-2" not in page.content
    # Nothing is left for the catch-up command.
    assert traces_search_index_missing() == 0


@pytest.fixture
def eager_tasks():
    from webapp.celery import app

    before = app.conf.task_always_eager
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = before


@pytest.mark.django_db
def test_every_message_writer_queues_its_traces_for_indexing(
    deployment, operator_client, django_capture_on_commit_callbacks, eager_tasks
):
    from feedback.models import Trace
    from feedback.services.ingest import trace_append_messages, traces_ingest
    from webapp.kernel.chat_format import parse_message

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        (result,) = traces_ingest(
            deployment=deployment, items=[{"external_id": "w1", "messages": [{"role": "user", "content": "hello"}]}]
        )
    assert len(callbacks) == 1
    assert b"w1" in operator_client.get("/traces/", {"q": "hello"}).content
    # An append (the gateway's path too) re-indexes the whole trace.
    with django_capture_on_commit_callbacks(execute=True):
        trace_append_messages(
            trace=Trace.objects.get(pk=result.trace_id),
            messages=[parse_message({"role": "assistant", "content": "a refund is on its way"}, "m")],
        )
    assert b"w1" in operator_client.get("/traces/", {"q": "hello refund"}).content
