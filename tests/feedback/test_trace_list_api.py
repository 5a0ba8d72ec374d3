"""GET /api/v1/traces: the dashboard's trace list for scripts — its filters, newest first, a
page at a time (keyset cursors), a key scoped to its own deployment, clear 400s."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from feedback.models import TraceStatus
from feedback.services.review import comment_add
from tests.factories import DeploymentFactory, MessageFactory, TraceFactory, user_with_role

pytestmark = pytest.mark.django_db
URL = "/api/v1/traces"


@pytest.fixture
def traces(deployment):
    now = timezone.now()
    made = [
        TraceFactory(
            deployment=deployment,
            external_id=f"run-{i}",
            environment="support-desk" if i % 2 else "chat",
            status=TraceStatus.ERROR if i % 3 == 0 else TraceStatus.OK,
            started_at=now - timedelta(minutes=i),
            preview="<script>alert(1)</script>" if i == 0 else f"order {i}",
        )
        for i in range(7)
    ]
    TraceFactory(deployment=DeploymentFactory(name="other-bot"), external_id="theirs")
    return made


def get(client, key, **params):
    return client.get(URL, params, HTTP_AUTHORIZATION=f"Bearer {key}")


def test_pages_walk_every_trace_once_newest_first_and_the_key_sees_its_deployment_only(client, traces, ingest_key):
    seen, answer = [], get(client, ingest_key, limit=3).json()
    while True:
        seen += [t["external_id"] for t in answer["results"]]
        if not answer["next"]:
            break
        assert answer["next"].startswith("http://testserver/api/v1/traces?") and "limit=3" in answer["next"]
        answer = client.get(answer["next"], HTTP_AUTHORIZATION=f"Bearer {ingest_key}").json()

    assert seen == [f"run-{i}" for i in range(7)]  # "theirs" is another deployment's
    first = get(client, ingest_key, limit=1).json()["results"][0]
    assert first["preview"] == "<script>alert(1)</script>"  # JSON carries it as data
    assert first["url"] == f"http://testserver/api/v1/traces/{traces[0].pk}"
    assert client.get(first["url"], HTTP_AUTHORIZATION=f"Bearer {ingest_key}").status_code == 200


def test_the_dashboards_filters_apply(client, traces, ingest_key):
    operator = user_with_role("operator")
    turn = MessageFactory(trace=traces[4], position=0, role="assistant", content="Refunded.")
    comment_add(message=turn, author=operator, body="should have looked it up first")

    def ids(**params):
        return [t["external_id"] for t in get(client, ingest_key, **params).json()["results"]]

    assert ids(environment="support-desk") == ["run-1", "run-3", "run-5"]
    assert ids(status="error") == ["run-0", "run-3", "run-6"]
    assert ids(status="error", environment="support-desk") == ["run-3"]
    assert ids(comment="yes") == ["run-4"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"status": "sideways"}, "status"),
        ({"reward_min": "lots"}, "reward_min"),
        ({"start": "yesterday"}, "start"),
        ({"after": "not-a-cursor"}, "after"),
        ({"limit": "0"}, "limit"),
        ({"limit": "5000"}, "limit"),
        ({"limit": "ten"}, "limit"),
    ],
)
def test_a_filter_that_cannot_be_read_is_a_400_naming_it(client, traces, ingest_key, params, field):
    answer = get(client, ingest_key, **params)

    assert answer.status_code == 400 and answer.json()["errors"][0]["field"] == field


def test_reading_needs_the_read_scope_and_a_key_cannot_ask_for_another_deployment(client, traces, deployment, make_key):
    ingest_only = make_key(deployment, ["ingest"])
    assert get(client, ingest_only).status_code == 403
    reader = make_key(deployment, ["read"])
    other = traces[0].deployment.__class__.objects.get(name="other-bot")
    answer = get(client, reader, deployment=other.pk)
    assert answer.status_code == 403 and answer.json()["errors"][0]["field"] == "deployment"
    assert (
        client.post(
            URL, {"traces": []}, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {reader}"
        ).status_code
        == 403
    )


def test_a_logged_in_operator_reads_every_deployment(client, traces):
    client.force_login(user_with_role("operator"))

    answer = client.get(URL, {"limit": 200}).json()

    assert {t["deployment"] for t in answer["results"]} == {"support-bot", "other-bot"}


def test_a_logged_in_person_cannot_post_traces_there_is_no_deployment_to_store_them_for(client):
    client.force_login(user_with_role("admin"))

    answer = client.post(URL, {"traces": []}, content_type="application/json")
    otlp = client.post("/api/v1/otel/v1/traces", b"", content_type="application/x-protobuf")

    assert answer.status_code == otlp.status_code == 403
    assert answer.json()["errors"][0]["field"] == "Authorization"


def test_the_filtered_list_downloads_as_chat_jsonl_for_fine_tuning(client, traces, ingest_key):
    import json

    for trace in traces:
        MessageFactory(trace=trace, position=0, role="user", content=f"Where is {trace.external_id}?")
        MessageFactory(trace=trace, position=1, role="assistant", content="<b>Shipped.</b>")

    answer = client.get(
        f"{URL}/export.jsonl", {"environment": "support-desk"}, HTTP_AUTHORIZATION=f"Bearer {ingest_key}"
    )

    assert answer.status_code == 200 and answer["Content-Type"] == "application/x-ndjson"
    rows = [json.loads(line) for line in _body(answer).splitlines()]
    assert [r["messages"][0]["content"] for r in rows] == [f"Where is run-{i}?" for i in (1, 3, 5)]
    assert rows[0]["messages"][1] == {"role": "assistant", "content": "<b>Shipped.</b>"}
    limited = client.get(f"{URL}/export.jsonl", {"limit": 2}, HTTP_AUTHORIZATION=f"Bearer {ingest_key}")
    assert len(_body(limited).splitlines()) == 2  # and never another deployment's
    bad = client.get(f"{URL}/export.jsonl", {"status": "sideways"}, HTTP_AUTHORIZATION=f"Bearer {ingest_key}")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "status"


def _body(response) -> bytes:
    """A streamed answer's bytes, read as the ASGI server reads it (an async iterator)."""
    from asgiref.sync import async_to_sync

    async def read() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)()


def test_the_export_is_pinned_to_the_keys_deployment_and_unknown_parameters_are_named(client, traces, ingest_key):
    other = traces[0].deployment.__class__.objects.get(name="other-bot")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ingest_key}"}

    assert client.get(f"{URL}/export.jsonl", {"deployment": other.pk}, **auth).status_code == 403
    exported = _body(client.get(f"{URL}/export.jsonl", **auth)).splitlines()
    assert len(exported) == 7  # its own seven, not the other deployment's one
    typo = client.get(URL, {"enviroment": "chat"}, **auth)
    assert typo.status_code == 400 and typo.json()["errors"][0]["field"] == "enviroment"


def test_a_download_that_fails_midway_ends_with_an_error_line(client, traces, ingest_key, monkeypatch):
    import json

    import feedback.apis

    def failing(**kwargs):
        yield b'{"messages": []}\n'
        raise RuntimeError("disk gone")

    monkeypatch.setattr(feedback.apis, "traces_jsonl_lines", failing)

    lines = _body(client.get(f"{URL}/export.jsonl", HTTP_AUTHORIZATION=f"Bearer {ingest_key}")).splitlines()

    assert json.loads(lines[-1]) == {"error": "the download stopped: RuntimeError"} and len(lines) == 2


def _parquet(response):
    import io

    import pyarrow.parquet as pq

    return pq.read_table(io.BytesIO(b"".join(response.streaming_content)))


def test_the_filtered_list_downloads_as_parquet_with_the_jsonl_rows(client, traces, ingest_key):
    import json

    tool = {"type": "function", "function": {"name": "lookup_order", "parameters": {"type": "object"}}}
    traces[0].tools = [tool]
    traces[0].save(update_fields=["tools"])
    for trace in traces:
        MessageFactory(trace=trace, position=0, role="user", content=f"Where is {trace.external_id}?")
        MessageFactory(
            trace=trace,
            position=1,
            role="assistant",
            content="",
            tool_calls=[{"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": "{}"}}],
        )
        MessageFactory(trace=trace, position=2, role="tool", content="<script>x</script>", tool_call_id="c1")
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ingest_key}"}

    answer = client.get(f"{URL}/export.parquet", {"environment": "support-desk"}, **auth)

    assert answer.status_code == 200 and answer["Content-Type"] == "application/vnd.apache.parquet"
    table = _parquet(answer)
    jsonl = [
        json.loads(x)
        for x in _body(client.get(f"{URL}/export.jsonl", {"environment": "support-desk"}, **auth)).splitlines()
    ]
    rows = table.to_pylist()
    assert [r["external_id"] for r in rows] == ["run-1", "run-3", "run-5"]
    for row, line in zip(rows, jsonl, strict=True):
        # The same messages as the JSONL line; a field a message lacks is a null.
        def present(messages):
            return [{k: v for k, v in m.items() if v is not None} for m in messages]

        assert present(row["messages"]) == present(line["messages"])
        assert (json.loads(row["tools"]) if row["tools"] else None) == line.get("tools")
    assert rows[0]["messages"][1]["tool_calls"][0]["function"] == {"name": "lookup_order", "arguments": "{}"}
    assert client.get(f"{URL}/export.parquet", {"limit": 2}, **auth).status_code == 200
    assert _parquet(client.get(f"{URL}/export.parquet", {"limit": 2}, **auth)).num_rows == 2
    assert _parquet(client.get(f"{URL}/export.parquet", {"environment": "nowhere"}, **auth)).num_rows == 0
    bad = client.get(f"{URL}/export.parquet", {"status": "sideways"}, **auth)
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "status"
