"""What the gateway refuses before it calls the model (the real openai client, a scripted upstream)."""

from __future__ import annotations

import openai
import pytest

from feedback.models import Trace

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize(
    ("metadata", "headers", "param"),
    [
        ({"trace_id": "conv-1\r\nX-Injected: 1"}, {}, "metadata.trace_id"),
        ({"trace_id": "conv\x00-1"}, {}, "metadata.trace_id"),
        ({"trace_id": "conv\x1b[31m"}, {}, "metadata.trace_id"),
        ({"session_id": "s\n1"}, {}, "metadata.session_id"),
        ({}, {"X-Practicum-Trace-Id": "conv\t1"}, "X-Practicum-Trace-Id"),
    ],
)
def test_a_control_character_in_a_trace_or_session_id_is_a_400_before_the_model_is_called(
    gateway, openai_client, fake_live, chat_upstream, metadata, headers, param
):
    with pytest.raises(openai.BadRequestError) as exc:
        openai_client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"metadata": metadata},
            extra_headers=headers,
        )
    error = exc.value.body
    assert error["param"] == param and "control character" in error["message"]
    assert chat_upstream.requests == []  # the model never answered a call the client cannot receive
    gateway.drain()
    assert not Trace.objects.exists()


def test_printable_trace_ids_still_work_and_come_back_in_the_header(gateway, openai_client, fake_live):
    raw = openai_client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "hi"}], extra_body={"metadata": {"trace_id": "conv é-1"}}
    )
    assert raw.parse().choices[0].message.content == "hello"
    gateway.drain()
    assert Trace.objects.get().external_id == "conv é-1"


def test_metadata_nested_too_deep_is_a_400_naming_the_field(gateway, openai_client, fake_live, chat_upstream):
    deep: dict = {}
    node = deep
    for _ in range(80):
        node["x"] = {}
        node = node["x"]
    with pytest.raises(openai.BadRequestError) as exc:
        openai_client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], extra_body={"metadata": deep}
        )
    assert (exc.value.body["param"], exc.value.body["message"]) == ("metadata", "nested more than 64 levels deep")
    assert chat_upstream.requests == []


def _nested(levels: int, leaf: str) -> str:
    """JSON text of objects nested `levels` deep (as text: Python's encoders stop near 1000)."""
    return '{"x":' * (levels - 1) + leaf + "}" * (levels - 1)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        # Deep enough that the logged exchange could not be stored (orjson stops at 1024 levels).
        ("response_format", '{"type": "json_schema", "json_schema": ' + _nested(1010, "{}") + "}"),
        ("stop", "[" + _nested(1010, "[]") + "]"),
        ("tool_choice", '{"type": "function", "function": ' + _nested(1010, "{}") + "}"),
        # And past the limit every other way in applies.
        ("response_format", '{"type": "json_schema", "json_schema": ' + _nested(70, "{}") + "}"),
    ],
)
def test_other_fields_nested_too_deep_are_a_400_naming_the_field(
    gateway, api_key, fake_live, chat_upstream, field, value
):
    import json
    import urllib.error
    import urllib.request

    body = '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "' + field + '": ' + value + "}"
    request = urllib.request.Request(
        f"{gateway.url}/v1/chat/completions",
        data=body.encode(),
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(request, timeout=60)
    assert exc.value.code == 400
    error = json.loads(exc.value.read())["error"]
    assert (error["param"], error["message"]) == (field, "nested more than 64 levels deep")
    assert chat_upstream.requests == []
    gateway.drain()
    assert not Trace.objects.exists()


def test_a_response_format_within_the_depth_limit_is_logged(gateway, openai_client, fake_live, chat_upstream):
    import json

    schema = json.loads(_nested(20, '{"type": "object"}'))
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    openai_client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], response_format=fmt)
    gateway.drain()
    assert Trace.objects.get().messages.count() == 2


def test_the_health_endpoint_reports_the_log_writer_and_its_queue(gateway):
    import httpx

    response = httpx.get(f"{gateway.url}/v1/health")
    assert response.status_code == 200
    report = response.json()["recorder"]
    assert report["status"] == "ok" and report["writer_alive"] is True
    assert report["queue_depth"] == 0 and report["queue_size"] > 0


def test_the_gateway_applies_the_batch_apis_messages_per_trace_limit(
    gateway, openai_client, fake_live, chat_upstream, settings
):
    settings.INGEST_MAX_MESSAGES_PER_TRACE = 6
    history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(6)]
    with pytest.raises(openai.BadRequestError) as exc:
        openai_client.chat.completions.create(model="m", messages=history)
    assert exc.value.body["param"] == "messages" and "at most 5 per call" in exc.value.body["message"]
    assert chat_upstream.requests == []
    openai_client.chat.completions.create(model="m", messages=history[:5])  # the answer makes 6: allowed
    gateway.drain()
    assert Trace.objects.get().message_count == 6
