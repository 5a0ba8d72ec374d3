"""POST /api/v1/otel/v1/traces: an agent instrumented with OpenTelemetry sends its spans with
the real SDK's OTLP/HTTP exporter, and each run becomes one trace with its turns in order."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from feedback.models import Trace, TraceSource

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/api/v1/otel/v1/traces"
TOOLS = [{"type": "function", "name": "lookup_order", "parameters": {"type": "object"}}]
SYSTEM = [{"type": "text", "content": "You are Acme's support agent."}]
USER = {"role": "user", "parts": [{"type": "text", "content": "Where is order <b>A1042</b>?"}]}
CALL = {
    "role": "assistant",
    "parts": [{"type": "tool_call", "id": "call_1", "name": "lookup_order", "arguments": {"order_id": "A1042"}}],
}
RESULT = {
    "role": "tool",
    "parts": [{"type": "tool_call_response", "id": "call_1", "response": '{"status": "shipped"}'}],
}
ANSWER = {"role": "assistant", "parts": [{"type": "text", "content": "It has shipped."}], "finish_reason": "stop"}


def tracer(url: str, key: str, *, compression=Compression.NoCompression):
    provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
    exporter = OTLPSpanExporter(
        endpoint=url + PATH, headers={"Authorization": f"Bearer {key}"}, compression=compression
    )
    results: list[SpanExportResult] = []
    export = exporter.export
    exporter.export = lambda spans: results.append(export(spans)) or results[-1]
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("support-agent"), provider, results


def chat(tracer, inputs, outputs, *, model="smollm2", tokens=(40, 8), with_tools=True):
    with tracer.start_as_current_span("chat smollm2") as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        span.set_attribute("gen_ai.request.model", model)
        span.set_attribute("gen_ai.response.model", model)
        span.set_attribute("gen_ai.usage.input_tokens", tokens[0])
        span.set_attribute("gen_ai.usage.output_tokens", tokens[1])
        span.set_attribute("gen_ai.response.finish_reasons", ["stop"])
        span.set_attribute("gen_ai.system_instructions", json.dumps(SYSTEM))
        span.set_attribute("gen_ai.input.messages", json.dumps(inputs))
        span.set_attribute("gen_ai.output.messages", json.dumps(outputs))
        if with_tools:
            span.set_attribute("gen_ai.tool.definitions", json.dumps(TOOLS))


def tool(tracer, call_id, result):
    with tracer.start_as_current_span("execute_tool lookup_order") as span:
        span.set_attribute("gen_ai.operation.name", "execute_tool")
        span.set_attribute("gen_ai.tool.name", "lookup_order")
        span.set_attribute("gen_ai.tool.call.id", call_id)
        span.set_attribute("gen_ai.tool.call.result", result)


def test_an_instrumented_agent_run_is_one_trace_with_its_turns_tool_results_and_serving_data(
    live_server, deployment, ingest_key
):
    t, provider, results = tracer(live_server.url, ingest_key, compression=Compression.Gzip)
    with t.start_as_current_span("invoke_agent support") as run:
        run.set_attribute("gen_ai.operation.name", "invoke_agent")
        run.set_attribute("gen_ai.agent.name", "support")
        run.set_attribute("gen_ai.conversation.id", "customer-17")
        chat(t, [USER], [CALL])
        # This instrumentation records tool results on tool spans, not in the next input.
        tool(t, "call_1", '{"status": "shipped"}')
        chat(t, [USER, CALL], [ANSWER], tokens=(60, 5))
        trace_id = format(run.get_span_context().trace_id, "032x")
    provider.shutdown()

    assert results and all(r is SpanExportResult.SUCCESS for r in results)
    trace = Trace.objects.get(deployment=deployment, external_id=trace_id)
    assert (trace.source, trace.session_id, trace.model_name) == (TraceSource.OTEL, "customer-17", "smollm2")
    assert trace.metadata["agent"] == "support" and trace.metadata["otel"]["service_name"] == "support-agent"
    messages = list(trace.messages.order_by("position"))
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[1].content == "Where is order <b>A1042</b>?"
    assert messages[2].tool_calls[0]["function"] == {"name": "lookup_order", "arguments": '{"order_id": "A1042"}'}
    assert messages[3].tool_call_id == "call_1" and messages[3].content == '{"status": "shipped"}'
    assert messages[4].content == "It has shipped." and messages[4].usage == {
        "prompt_tokens": 60,
        "completion_tokens": 5,
        "total_tokens": 65,
    }
    assert trace.total_tokens == 48 + 65
    assert messages[4].latency_ms is not None and messages[4].latency_ms >= 0
    assert trace.tools[0]["function"]["name"] == "lookup_order"
    assert trace.ended_at >= trace.started_at


def test_a_run_exported_over_several_requests_grows_one_trace_and_a_retry_changes_nothing(
    live_server, deployment, ingest_key
):
    t, provider, results = tracer(live_server.url, ingest_key)
    with t.start_as_current_span("invoke_agent support") as run:
        chat(t, [USER], [CALL])  # each span is its own export (SimpleSpanProcessor)
        trace_id = format(run.get_span_context().trace_id, "032x")
        assert Trace.objects.get(external_id=trace_id).message_count == 3
        # The tool span (its own export) writes the result more tightly than the next
        # call's input does: one tool message, the span's, and nothing refused.
        tool(t, "call_1", '{"status":"shipped"}')
        assert Trace.objects.get(external_id=trace_id).message_count == 4
        chat(t, [USER, CALL, RESULT], [ANSWER])
    provider.shutdown()

    trace = Trace.objects.get(external_id=trace_id)
    messages = list(trace.messages.order_by("position"))
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[3].content == '{"status":"shipped"}' and messages[4].content == "It has shipped."
    assert len(results) == 4 and all(r is SpanExportResult.SUCCESS for r in results)


def _export(url, key, body: bytes, content_type="application/x-protobuf", **headers):
    return httpx.post(
        url + PATH, content=body, headers={"Authorization": f"Bearer {key}", "Content-Type": content_type, **headers}
    )


def _request_of(spans_json: list[dict]) -> dict:
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "agent"}}]},
                "scopeSpans": [{"scope": {"name": "openinference"}, "spans": spans_json}],
            }
        ]
    }


def _attrs(values: dict) -> list[dict]:
    out = []
    for k, v in values.items():
        kind = "intValue" if isinstance(v, int) else "stringValue"
        out.append({"key": k, "value": {kind: str(v) if kind == "intValue" else v}})
    return out


def test_otlp_json_with_openinference_attributes_is_read_and_answered_in_json(live_server, deployment, ingest_key):
    trace_id = "5b8efff798038103d269b633813fc60c"
    span = {
        "traceId": trace_id,
        "spanId": "eee19b7ec3c1b174",
        "name": "ChatCompletion",
        "startTimeUnixNano": "1764700000000000000",
        "endTimeUnixNano": "1764700000500000000",
        "attributes": _attrs(
            {
                "openinference.span.kind": "LLM",
                "llm.model_name": "gpt-4o-mini",
                "llm.input_messages.0.message.role": "system",
                "llm.input_messages.0.message.content": "Be brief.",
                "llm.input_messages.1.message.role": "user",
                "llm.input_messages.1.message.content": "Refund A7?",
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.tool_calls.0.tool_call.id": "c9",
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "issue_refund",
                "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"order_id": "A7"}',
                "llm.token_count.prompt": 12,
                "llm.token_count.completion": 7,
                "session.id": "s-9",
            }
        ),
    }

    answer = _export(live_server.url, ingest_key, json.dumps(_request_of([span])).encode(), "application/json")

    assert answer.status_code == 200 and answer.headers["content-type"] == "application/json"
    assert answer.json() == {}  # nothing rejected
    trace = Trace.objects.get(external_id=trace_id)
    assert (trace.model_name, trace.session_id) == ("gpt-4o-mini", "s-9")
    turns = list(trace.messages.order_by("position"))
    assert [m.role for m in turns] == ["system", "user", "assistant"]
    assert turns[2].tool_calls[0]["function"]["name"] == "issue_refund" and turns[2].latency_ms == 500.0


def test_spans_without_message_content_are_rejected_with_the_reason_and_the_others_kept(
    live_server, deployment, ingest_key
):
    t, provider, _results = tracer(live_server.url, ingest_key)
    with t.start_as_current_span("chat smollm2") as bare:  # content capture off: no messages
        bare.set_attribute("gen_ai.operation.name", "chat")
        bare_id = format(bare.get_span_context().trace_id, "032x")
    provider.shutdown()
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes.fromhex("ab" * 16), bytes.fromhex("cd" * 8), "chat"
    span.attributes.add(key="gen_ai.operation.name").value.string_value = "chat"
    http = request.resource_spans[0].scope_spans[0].spans.add()  # a plain HTTP span: no model call
    http.trace_id, http.span_id, http.name = bytes.fromhex("ef" * 16), bytes.fromhex("01" * 8), "GET /"

    answer = _export(live_server.url, ingest_key, request.SerializeToString())

    assert answer.status_code == 200 and answer.headers["content-type"] == "application/x-protobuf"
    partial = ExportTraceServiceResponse.FromString(answer.content).partial_success
    assert partial.rejected_spans == 2
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" in partial.error_message
    assert "no GenAI or OpenInference model-call span" in partial.error_message
    assert not Trace.objects.filter(external_id__in=[bare_id, "ab" * 16, "ef" * 16]).exists()


@pytest.mark.parametrize(
    ("body", "headers", "status", "field"),
    [
        (b"\x0a\x05garbage", {}, 400, "body"),
        (b"{not json", {"Content-Type": "application/json"}, 400, "body"),
        (
            json.dumps(_request_of([{"traceId": "zz", "spanId": "01"}])).encode(),
            {"Content-Type": "application/json"},
            400,
            "traceId",
        ),
        (b"not gzip", {"Content-Encoding": "gzip"}, 400, "body"),
        (b"x", {"Content-Encoding": "br"}, 400, "Content-Encoding"),
        (b"x", {"Content-Type": "text/plain"}, 415, "Content-Type"),
    ],
)
def test_a_body_that_is_not_an_export_is_a_clear_error(
    live_server, deployment, ingest_key, body, headers, status, field
):
    answer = _export(live_server.url, ingest_key, body, **({"Content-Type": "application/x-protobuf"} | headers))

    assert answer.status_code == status, answer.text
    assert answer.json()["errors"][0]["field"] == field
    assert not Trace.objects.exists()


def test_a_gzip_bomb_is_refused_and_a_key_without_the_ingest_scope_is_forbidden(
    live_server, deployment, make_key, settings
):
    key = make_key(deployment, ["ingest"])
    settings.INGEST_MAX_BODY_BYTES = 10_000
    bomb = gzip.compress(b"\x00" * 1_000_000)
    assert len(bomb) < 10_000

    answer = _export(live_server.url, key, bomb, **{"Content-Encoding": "gzip"})

    assert answer.status_code == 400 and "unpacks to more than 10000 bytes" in answer.json()["errors"][0]["reason"]
    feedback_only = make_key(deployment, ["feedback"])
    assert _export(live_server.url, feedback_only, b"").status_code == 403
    assert httpx.post(live_server.url + PATH, content=b"").status_code in (401, 403)


def _recorded_export(build) -> bytes:
    """The protobuf body the SDK's exporter sends for the spans `build(tracer)` makes."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "support-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    build(provider.get_tracer("support-agent"))
    provider.shutdown()
    return encode_spans(memory.get_finished_spans()).SerializeToString()


def test_a_resent_export_is_stored_once_and_a_tool_span_ahead_of_its_model_call_is_held(
    live_server, deployment, ingest_key
):
    def run(t):
        with t.start_as_current_span("invoke_agent support"):
            chat(t, [USER], [CALL])

    body = _recorded_export(run)
    for _ in range(2):  # the exporter retries after a timeout
        answer = _export(live_server.url, ingest_key, body)
        assert (
            answer.status_code == 200
            and not ExportTraceServiceResponse.FromString(answer.content).partial_success.rejected_spans
        )
    (trace,) = Trace.objects.all()
    assert trace.message_count == 3

    def tool_first(t):
        with t.start_as_current_span("invoke_agent support"):
            tool(t, "call_7", "ok")

    answer = _export(live_server.url, ingest_key, _recorded_export(tool_first))
    assert not ExportTraceServiceResponse.FromString(answer.content).partial_success.rejected_spans
    assert Trace.objects.count() == 1  # held until its model call arrives


def test_the_earlier_event_convention_is_read_too(live_server, deployment, ingest_key):
    def run(t):
        with t.start_as_current_span("chat gpt") as span:
            span.set_attribute("gen_ai.operation.name", "chat")
            span.set_attribute("gen_ai.request.model", "gpt-4o-mini")
            span.add_event("gen_ai.system.message", {"content": "Be kind."})
            span.add_event("gen_ai.user.message", {"content": "Hi"})
            span.add_event("gen_ai.choice", {"message": json.dumps({"content": "Hello!"}), "finish_reason": "stop"})

    assert _export(live_server.url, ingest_key, _recorded_export(run)).status_code == 200

    (trace,) = Trace.objects.all()
    assert [(m.role, m.content) for m in trace.messages.order_by("position")] == [
        ("system", "Be kind."),
        ("user", "Hi"),
        ("assistant", "Hello!"),
    ]
    assert trace.messages.get(position=2).finish_reason == "stop"


def test_the_guide_example_runs_as_printed(live_server, deployment, ingest_key, monkeypatch, capsys):
    import re
    from pathlib import Path

    guide = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "opentelemetry.md"
    section = guide.read_text()
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"{live_server.url}/api/v1/otel")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", f"Authorization=Bearer%20{ingest_key}")

    exec(compile(code, str(guide), "exec"), {})

    trace_id = capsys.readouterr().out.split()[-1]
    trace = Trace.objects.get(deployment=deployment, external_id=trace_id)
    assert [m.role for m in trace.messages.order_by("position")] == ["user", "assistant", "tool", "assistant"]
    assert trace.session_id == "customer-17" and trace.messages.last().content == "It shipped yesterday."


def _one_span_request(trace_hex: str, span_hex: str, attributes: dict, *, start=1) -> bytes:
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = bytes.fromhex(trace_hex), bytes.fromhex(span_hex), "chat\x00"
    span.start_time_unix_nano, span.end_time_unix_nano = start, start + 10
    for key, value in attributes.items():
        target = span.attributes.add(key=key).value
        if isinstance(value, float):
            target.double_value = value
        else:
            target.string_value = value
    return request.SerializeToString()


def test_nul_and_nan_in_spans_are_stored_as_text_and_null_not_a_500(live_server, deployment, ingest_key):
    trace_hex = "12" * 16
    chat_attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m\x00odel",
        "gen_ai.conversation.id": "s\x00-1",
        "weird": float("nan"),
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "he\x00llo"}]}]),
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "o\x00k"}]}]),
        "metadata": '{"a": NaN, "b": "x\\u0000y"}',
    }

    answer = _export(live_server.url, ingest_key, _one_span_request(trace_hex, "34" * 8, chat_attrs))

    assert answer.status_code == 200, answer.text
    trace = Trace.objects.get(external_id=trace_hex)
    assert trace.model_name == "m\ufffdodel" and trace.session_id == "s\ufffd-1"
    assert trace.metadata["a"] is None and trace.metadata["b"] == "x\ufffdy"
    # The next model call repeats that history: it is the same history, and the trace grows.
    follow = dict(chat_attrs)
    follow["gen_ai.input.messages"] = json.dumps(
        [
            {"role": "user", "parts": [{"type": "text", "content": "he\x00llo"}]},
            {"role": "assistant", "parts": [{"type": "text", "content": "o\x00k"}]},
            {"role": "user", "parts": [{"type": "text", "content": "thanks"}]},
        ]
    )
    answer = _export(live_server.url, ingest_key, _one_span_request(trace_hex, "56" * 8, follow, start=100))
    assert not ExportTraceServiceResponse.FromString(answer.content).partial_success.rejected_spans, answer.content
    assert [m.content for m in trace.messages.order_by("position")] == ["he\ufffdllo", "o\ufffdk", "thanks", "o\ufffdk"]


def test_a_span_sent_twice_in_one_export_is_one_turn_and_a_refused_export_does_not_block_the_next(
    live_server, deployment, ingest_key
):
    trace_hex = "9a" * 16
    chat_attrs = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps([USER]),
        "gen_ai.output.messages": json.dumps([ANSWER]),
    }
    once = ExportTraceServiceRequest.FromString(_one_span_request(trace_hex, "bc" * 8, chat_attrs))
    twice = ExportTraceServiceRequest()
    twice.resource_spans.extend([once.resource_spans[0], once.resource_spans[0]])
    assert _export(live_server.url, ingest_key, twice.SerializeToString()).status_code == 200
    trace = Trace.objects.get(external_id=trace_hex)
    assert [m.role for m in trace.messages.order_by("position")] == ["user", "assistant"]

    # A model call that started before the stored one, with other words, would rewrite the
    # stored history: refused, and not kept...
    earlier = dict(
        chat_attrs,
        **{
            "gen_ai.input.messages": json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": "Something else"}]}]
            )
        },
    )
    answer = _export(live_server.url, ingest_key, _one_span_request(trace_hex, "de" * 8, earlier, start=0))
    partial = ExportTraceServiceResponse.FromString(answer.content).partial_success
    assert partial.rejected_spans == 1 and "differs from the stored message" in partial.error_message
    # ...so the run's next, consistent call still lands.
    good = dict(chat_attrs, **{"gen_ai.input.messages": json.dumps([USER, ANSWER, USER])})
    answer = _export(live_server.url, ingest_key, _one_span_request(trace_hex, "ef" * 8, good, start=90))
    assert not ExportTraceServiceResponse.FromString(answer.content).partial_success.rejected_spans
    assert [m.role for m in trace.messages.order_by("position")] == ["user", "assistant", "user", "assistant"]


def test_a_batch_resend_with_other_serving_data_is_still_a_rewrite(client, deployment, ingest_key):
    turn = {"role": "assistant", "content": "Hi", "token_ids": [1, 2], "finish_reason": "stop"}
    body = {"traces": [{"external_id": "b1", "messages": [{"role": "user", "content": "Hello"}, turn]}]}
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ingest_key}"}
    assert client.post("/api/v1/traces", body, content_type="application/json", **auth).json()["created"] == 1

    changed = {**turn, "token_ids": [7, 7, 7], "finish_reason": "length"}
    body["traces"][0]["messages"][1] = changed
    answer = client.post("/api/v1/traces", body, content_type="application/json", **auth).json()

    assert answer["error"] == 1 and answer["results"][0]["errors"][0]["field"] == "messages[1]"
    bare = {"role": "assistant", "content": "Hi"}  # left out, not changed: the same turn
    body["traces"][0]["messages"][1] = bare
    assert client.post("/api/v1/traces", body, content_type="application/json", **auth).json()["exists"] == 1


def test_a_late_export_of_an_earlier_call_with_its_serving_data_is_not_a_rewrite(live_server, deployment, ingest_key):
    """The exporter retried call 1 after call 2 had landed: call 2's input holds turn 1 bare,
    call 1 carries turn 1 with its tokens and latency. The same turn, not a contradiction."""
    trace_hex = "77" * 16
    first = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps([USER]),
        "gen_ai.output.messages": json.dumps([CALL]),
    }
    second = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps([USER, CALL, RESULT]),
        "gen_ai.output.messages": json.dumps([ANSWER]),
    }
    answer = _export(live_server.url, ingest_key, _one_span_request(trace_hex, "a1" * 8, second, start=100))
    assert not ExportTraceServiceResponse.FromString(answer.content).partial_success.rejected_spans

    answer = _export(live_server.url, ingest_key, _one_span_request(trace_hex, "a2" * 8, first, start=10))

    assert not ExportTraceServiceResponse.FromString(answer.content).partial_success.rejected_spans, answer.content
    assert [m.role for m in Trace.objects.get(external_id=trace_hex).messages.order_by("position")] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]


def test_a_call_that_ends_after_the_agents_span_still_extends_the_trace_and_an_error_stays(
    live_server, deployment, ingest_key
):
    t, provider, _results = tracer(live_server.url, ingest_key)
    with t.start_as_current_span("invoke_agent support") as run:
        with t.start_as_current_span("chat smollm2") as failing:
            failing.set_attribute("gen_ai.operation.name", "chat")
            failing.set_attribute("gen_ai.input.messages", json.dumps([USER]))
            failing.set_attribute("gen_ai.output.messages", json.dumps([CALL]))
            failing.set_status(trace_api.Status(trace_api.StatusCode.ERROR))
        tool(t, "call_1", '{"status":"shipped"}')
        trace_id = format(run.get_span_context().trace_id, "032x")
        context = trace_api.set_span_in_context(run)
    # A follow-up call under the agent's span, ending after it (streaming, background work),
    # whose input writes the tool result its own way.
    late = t.start_span("chat smollm2", context=context)
    late.set_attribute("gen_ai.operation.name", "chat")
    late.set_attribute("gen_ai.input.messages", json.dumps([USER, CALL, RESULT]))
    late.set_attribute("gen_ai.output.messages", json.dumps([ANSWER]))
    late.end()
    provider.shutdown()

    trace = Trace.objects.get(external_id=trace_id)
    assert [m.role for m in trace.messages.order_by("position")] == ["user", "assistant", "tool", "assistant"]
    assert trace.messages.get(position=3).content == "It has shipped."
    assert trace.status == "error" and trace.metadata["otel"]["spans"] == 4


def test_filters_at_the_edges_of_the_calendar_are_answered_and_options_is_a_read(client, deployment, make_key):
    reader = make_key(deployment, ["read"])
    auth = {"HTTP_AUTHORIZATION": f"Bearer {reader}"}

    assert client.get("/api/v1/traces", {"end": "9999-12-31", "start": "0001-01-01"}, **auth).status_code == 200
    assert client.options("/api/v1/traces", **auth).status_code == 200
