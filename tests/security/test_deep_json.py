"""JSON nested thousands of levels deep: refused per item wherever traces come in, and a
row stored before that bound never breaks a page or a failure-mode run."""

from __future__ import annotations

import io

import pytest

from feedback.failure_modes.services import failure_mode_run_execute
from feedback.models import FailureModeRun, Message, Trace, TraceFlag
from feedback.services.jsonl import traces_import_jsonl
from feedback.services.queues import queue_create, queue_next_item
from feedback.services.review import FieldError, correction_add
from tests.feedback.conftest import TOOLS, tool_conversation
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db
DEEP_TEXT = "[" * 3000 + "]" * 3000  # 6 kB


def nested(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


def deep_call_conversation() -> list[dict]:
    messages = tool_conversation()
    messages[2]["tool_calls"][0]["function"]["arguments"] = DEEP_TEXT
    return messages


def test_the_batch_api_refuses_deep_json_per_item_and_keeps_the_others(client, ingest_key):
    body = {
        "traces": [
            {"external_id": "deep-args", "tools": TOOLS, "messages": deep_call_conversation()},
            {"external_id": "fine", "tools": TOOLS, "messages": tool_conversation()},
            {"external_id": "deep-meta", "metadata": nested(300), "messages": tool_conversation()},
            {
                "external_id": "deep-tools",
                "tools": [{"type": "function", "function": {"name": "x", "parameters": nested(100)}}],
                "messages": tool_conversation(),
            },
            {
                "external_id": "deep-content",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x": nested(80)}]}],
            },
        ]
    }
    r = client.post("/api/v1/traces", body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {ingest_key}")
    assert r.status_code == 207, r.content[:300]
    results = r.json()["results"]
    assert [x["status"] for x in results] == ["error", "created", "error", "error", "error"]
    assert results[0]["errors"] == [
        {"field": "messages[2].tool_calls[0].function.arguments", "reason": "nested more than 64 levels deep"}
    ]
    assert results[2]["errors"][0]["field"] == "metadata"
    assert results[3]["errors"][0]["field"] == "tools[0]"
    assert results[4]["errors"][0]["field"] == "messages[0]"
    assert list(Trace.objects.values_list("external_id", flat=True)) == ["fine"]

    # Deeper than any JSON parser here accepts: the whole body is refused, clearly.
    r = client.post(
        "/api/v1/traces",
        '{"traces": ' + "[" * 2000 + "]" * 2000 + "}",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {ingest_key}",
    )
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "body"


def test_jsonl_import_refuses_deep_lines_by_number(deployment):
    import orjson

    lines = [
        {"external_id": "ok", "messages": tool_conversation()},
        {"external_id": "deep", "tools": TOOLS, "messages": deep_call_conversation()},
    ]
    report = traces_import_jsonl(deployment=deployment, stream=io.BytesIO(b"\n".join(orjson.dumps(x) for x in lines)))
    assert report.created == 1
    assert report.errors == ["line 2: messages[2].tool_calls[0].function.arguments: nested more than 64 levels deep"]


def test_a_correction_with_deep_arguments_is_a_field_error(ingest, deployment, operator):
    trace = ingest(deployment, {"external_id": "c", "tools": TOOLS, "messages": tool_conversation()})[0]
    message = trace.messages.get(position=4)
    call = {
        "id": "x",
        "type": "function",
        "function": {"name": "lookup_order", "arguments": '{"order_id": ' + "[" * 500 + "]" * 500 + "}"},
    }
    with pytest.raises(FieldError, match="nested more than 64 levels deep"):
        correction_add(message=message, author=operator, tool_calls=[call])
    call["function"]["arguments"] = {"order_id": nested(300)}
    with pytest.raises(FieldError, match="nested more than 64 levels deep"):
        correction_add(message=message, author=operator, tool_calls=[call])


@pytest.fixture
def stored_deep_trace(ingest, deployment):
    """A trace stored before ingest bounded depth: deep arguments, raw JSON and tool schema."""
    trace = ingest(deployment, {"external_id": "old-deep", "tools": TOOLS, "messages": tool_conversation()})[0]
    call = trace.messages.get(position=2)
    call.tool_calls[0]["function"]["arguments"] = DEEP_TEXT
    Message.objects.filter(pk=call.pk).update(
        tool_calls=call.tool_calls, raw={"role": "assistant", "deep": nested(400)}
    )
    tools = [{"type": "function", "function": {"name": "lookup_order", "parameters": nested(400)}}]
    Trace.objects.filter(pk=trace.pk).update(tools=tools)
    return trace


def test_pages_render_a_stored_deep_trace(client, stored_deep_trace, operator, reviewer):
    trace = stored_deep_trace
    client.force_login(operator)
    for url in (
        f"/traces/{trace.id}/",
        f"/traces/{trace.id}/messages/2/correction",
        f"/traces/{trace.id}/messages/2/raw",
    ):
        assert client.get(url).status_code == 200, url
    assert client.get(f"/traces/{trace.id}/messages/2/raw", HTTP_HX_REQUEST="true").status_code == 200

    queue = queue_create(name="deep", traces=Trace.objects.filter(pk=trace.pk), filters={}, created_by=operator)
    item = queue_next_item(queue=queue, user=reviewer)
    client.force_login(reviewer)
    assert client.get(f"/queues/{queue.pk}/items/{item.pk}/").status_code == 200


def test_a_failure_mode_run_flags_a_deep_trace_instead_of_failing(stored_deep_trace, deployment):
    run = FailureModeRun.objects.create(deployment=deployment, max_traces=100)
    failure_mode_run_execute(run=run, endpoint=None, embed=lambda texts: __import__("numpy").zeros((len(texts), 4)))
    run.refresh_from_db()
    assert run.status == WorkStatus.FINISHED, run.error
    assert TraceFlag.objects.filter(trace=stored_deep_trace, name="invalid-tool-args").exists()


def test_the_gateway_refuses_deep_messages_and_tools_through_the_same_check():
    from feedback.gateway.app import GatewayApp
    from feedback.gateway.errors import GatewayError

    deep_call = {"role": "assistant", "content": None, "tool_calls": deep_call_conversation()[2]["tool_calls"]}
    for request, param in (
        ({"messages": [{"role": "user", "content": "hi"}, deep_call]}, "messages[1].tool_calls[0].function.arguments"),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "x", "parameters": nested(100)}}],
            },
            "tools[0]",
        ),
    ):
        with pytest.raises(GatewayError) as exc:
            GatewayApp._validate(request)
        assert (exc.value.status, exc.value.param, exc.value.message) == (400, param, "nested more than 64 levels deep")
