"""POST /api/v1/traces and GET /api/v1/traces/<id>: what an agent's logging client relies on."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from feedback.models import Message, Trace
from tests.factories import DeploymentFactory

URL = "/api/v1/traces"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
        },
    }
]


def tool_trace(external_id: str = "ep-1", **extra) -> dict:
    return {
        "external_id": external_id,
        "session_id": "s-1",
        "environment": "support-desk",
        "model": "smollm2",
        "metadata": {"channel": "web"},
        "tools": TOOLS,
        "messages": [
            {"role": "system", "content": "You are support."},
            {"role": "user", "content": [{"type": "text", "text": "Where is order A1?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
            {
                "role": "assistant",
                "content": "It has shipped.",
                "finish_reason": "stop",
                "usage": {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34},
            },
        ],
        **extra,
    }


def post(client: Client, key: str | None, body, **headers):
    if key:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {key}"
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(URL, data=data, content_type="application/json", **headers)


@pytest.mark.django_db
def test_ingest_openai_trace_with_tool_calls_keeps_every_message_in_order(client, ingest_key):
    response = post(client, ingest_key, {"traces": [tool_trace()]})
    assert response.status_code == 207
    body = response.json()
    assert body["created"] == 1 and body["results"][0]["status"] == "created"

    trace = Trace.objects.get(external_id="ep-1")
    assert (trace.session_id, trace.environment, trace.model_name) == ("s-1", "support-desk", "smollm2")
    assert trace.tools == TOOLS and trace.metadata == {"channel": "web"}
    assert (trace.message_count, trace.assistant_turn_count, trace.tool_call_count) == (5, 2, 1)
    assert trace.total_tokens == 34
    assert trace.preview == "Where is order A1?"
    messages = list(trace.messages.order_by("position"))
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[1].content_parts == [{"type": "text", "text": "Where is order A1?"}]
    assert messages[2].tool_calls[0]["function"]["name"] == "lookup_order"
    assert messages[3].tool_call_id == "call_1"
    assert messages[4].finish_reason == "stop"
    assert messages[4].raw == tool_trace()["messages"][4]

    read = client.get(f"{URL}/{trace.id}", HTTP_AUTHORIZATION=f"Bearer {ingest_key}")
    assert read.status_code == 200
    got = read.json()
    assert got["external_id"] == "ep-1"
    assert [m["role"] for m in got["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert got["messages"][2]["tool_calls"][0]["id"] == "call_1"
    assert got["messages"][2]["content"] is None


@pytest.mark.django_db
def test_resending_a_trace_does_not_duplicate_it(client, ingest_key):
    assert post(client, ingest_key, {"traces": [tool_trace()]}).json()["created"] == 1
    again = post(client, ingest_key, {"traces": [tool_trace()]}).json()
    assert again["results"][0]["status"] == "exists"
    assert Trace.objects.count() == 1
    assert Message.objects.count() == 5


@pytest.mark.django_db
def test_a_grown_conversation_appends_and_a_rewritten_one_is_refused(client, ingest_key):
    first = tool_trace()
    first["messages"] = first["messages"][:2]
    post(client, ingest_key, {"traces": [first]})

    grown = post(client, ingest_key, {"traces": [tool_trace()]}).json()
    assert grown["results"][0]["status"] == "appended"
    trace = Trace.objects.get()
    assert trace.message_count == 5 and trace.messages.count() == 5

    rewritten = tool_trace()
    rewritten["messages"][1] = {"role": "user", "content": "something else"}
    result = post(client, ingest_key, {"traces": [rewritten]}).json()["results"][0]
    assert result["status"] == "error"
    assert result["errors"][0]["field"] == "messages[1]"
    assert "rewritten" in result["errors"][0]["reason"]
    assert Trace.objects.get().messages.get(position=1).content == "Where is order A1?"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("bad_message", "field", "reason"),
    [
        ({"role": "robot", "content": "hi"}, "messages[1].role", "unknown role"),
        ({"role": "user"}, "messages[1].content", "required"),
        ({"role": "user", "content": 42}, "messages[1].content", "must be a string or an array"),
        ({"role": "tool", "content": "x"}, "messages[1].tool_call_id", "required"),
        ({"role": "assistant", "content": None, "tool_calls": "nope"}, "messages[1].tool_calls", "must be an array"),
        ("just a string", "messages[1]", "must be an object"),
    ],
)
def test_one_malformed_item_is_reported_and_the_good_ones_are_stored(client, ingest_key, bad_message, field, reason):
    bad = {"external_id": "bad", "messages": [{"role": "user", "content": "hi"}, bad_message]}
    body = {"traces": [tool_trace("good-1"), bad, tool_trace("good-2")]}
    response = post(client, ingest_key, body)
    assert response.status_code == 207
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["created", "error", "created"]
    assert results[1]["index"] == 1 and results[1]["external_id"] == "bad"
    assert results[1]["errors"][0]["field"] == field
    assert reason in results[1]["errors"][0]["reason"]
    assert set(Trace.objects.values_list("external_id", flat=True)) == {"good-1", "good-2"}
    assert not Message.objects.filter(trace__external_id="bad").exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("item", "field"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "external_id"),
        ({"external_id": 5, "messages": [{"role": "user", "content": "x"}]}, "external_id"),
        ({"external_id": "a", "messages": []}, "messages"),
        ({"external_id": "a", "messages": [{"role": "user", "content": "x"}], "metadata": [1]}, "metadata"),
        ({"external_id": "a", "messages": [{"role": "user", "content": "x"}], "started_at": "yesterday"}, "started_at"),
        (
            {"external_id": "a", "messages": [{"role": "user", "content": "x"}], "tools": [{"function": {}}]},
            "tools[0].function.name",
        ),
    ],
)
def test_bad_trace_fields_name_the_field(client, ingest_key, item, field):
    results = post(client, ingest_key, {"traces": [item]}).json()["results"]
    assert results[0]["status"] == "error"
    assert results[0]["errors"][0]["field"] == field
    assert Trace.objects.count() == 0


@pytest.mark.django_db
def test_duplicate_external_id_in_one_batch_is_reported(client, ingest_key):
    results = post(client, ingest_key, {"traces": [tool_trace("x"), tool_trace("x")]}).json()["results"]
    assert [r["status"] for r in results] == ["created", "error"]
    assert "more than once" in results[1]["errors"][0]["reason"]


@pytest.mark.django_db
@pytest.mark.parametrize("body", ["{not json", json.dumps([1, 2]), json.dumps({"traces": "x"})])
def test_a_body_that_is_not_a_batch_gets_400_with_the_reason(client, ingest_key, body):
    response = post(client, ingest_key, body)
    assert response.status_code == 400
    error = response.json()["errors"][0]
    assert error["field"] in {"body", "traces"} and error["reason"]


@pytest.mark.django_db
def test_keys_are_refused_when_missing_wrong_scope_expired_or_revoked(client, deployment, make_key):
    body = {"traces": [tool_trace()]}
    assert post(client, None, body).status_code == 401
    assert post(client, "prk_nothere_secret", body).status_code == 401
    assert post(client, "garbage", body).status_code == 401

    feedback_only = make_key(deployment, ["feedback"])
    response = post(client, feedback_only, body)
    assert response.status_code == 403
    assert "ingest" in response.json()["detail"]

    expired = make_key(deployment, ["ingest"], expires_at=timezone.now() - timedelta(minutes=1))
    response = post(client, expired, body)
    assert response.status_code == 401 and "expired" in response.json()["detail"]

    good = make_key(deployment, ["ingest"])
    tampered = good[:-1] + ("a" if good[-1] != "a" else "b")
    assert post(client, tampered, body).status_code == 401
    assert Trace.objects.count() == 0
    assert post(client, good, body).status_code == 207


@pytest.mark.django_db
def test_oversize_payloads_get_413_and_store_nothing(client, ingest_key, settings):
    settings.INGEST_MAX_BODY_BYTES = 10_000
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    big = tool_trace()
    big["messages"][1] = {"role": "user", "content": "x" * 20_000}
    response = post(client, ingest_key, {"traces": [big]})
    assert response.status_code == 413
    assert response.json()["errors"][0]["field"] == "body"

    settings.INGEST_MAX_BODY_BYTES = 10_000_000
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000_000
    settings.INGEST_MAX_TRACES_PER_BATCH = 2
    response = post(client, ingest_key, {"traces": [tool_trace(f"t{i}") for i in range(3)]})
    assert response.status_code == 413 and response.json()["errors"][0]["field"] == "traces"

    settings.INGEST_MAX_MESSAGES_PER_TRACE = 3
    result = post(client, ingest_key, {"traces": [tool_trace("long")]}).json()["results"][0]
    assert result["status"] == "error" and result["errors"][0]["field"] == "messages"
    assert Trace.objects.count() == 0


@pytest.mark.django_db
def test_a_key_reads_only_its_own_deployments_traces(client, ingest_key, make_key):
    post(client, ingest_key, {"traces": [tool_trace()]})
    trace = Trace.objects.get()
    other_key = make_key(DeploymentFactory(name="other-bot"), ["read", "ingest"])
    assert client.get(f"{URL}/{trace.id}", HTTP_AUTHORIZATION=f"Bearer {other_key}").status_code == 404
    # The same external id under another deployment is a different trace.
    assert post(client, other_key, {"traces": [tool_trace()]}).json()["created"] == 1
    assert Trace.objects.count() == 2


@pytest.mark.django_db
def test_openapi_schema_is_served_to_key_holders(client, ingest_key):
    assert client.get("/api/schema/", HTTP_ACCEPT="application/json").status_code in (401, 403)
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json", HTTP_AUTHORIZATION=f"Bearer {ingest_key}")
    assert response.status_code == 200
    assert b"/api/v1/traces" in response.content


@pytest.mark.django_db
def test_nul_characters_in_untrusted_content_do_not_fail_the_batch(client, ingest_key, settings):
    trace = tool_trace("nul")
    trace["messages"][1] = {"role": "user", "content": "before\x00after"}
    trace["metadata"] = {"note": "a\x00b"}
    response = post(client, ingest_key, {"traces": [trace, tool_trace("plain")]})
    assert response.status_code == 207 and response.json()["created"] == 2
    stored = Trace.objects.get(external_id="nul")
    # PostgreSQL cannot hold NUL in text or jsonb: it becomes U+FFFD there; SQLite keeps it.
    nul = "\ufffd" if settings.IS_POSTGRES else "\x00"
    assert stored.messages.get(position=1).content == f"before{nul}after"
    assert stored.metadata["note"] == f"a{nul}b"
