"""OTLP ingest at the cost of what an export carries: parked spans keep only what the trace
mapping reads, within per-span and per-trace byte bounds, and an export that extends a
trace neither re-reads its earlier spans nor its stored messages."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from feedback.models import OtelSpan, OtelTrace, Trace
from feedback.services import otlp_ingest as ingest_module
from feedback.services.otlp_ingest import otlp_ingest

pytestmark = pytest.mark.django_db

PATH = "/api/v1/otel/v1/traces"
TRACE = "4f" * 16


def _text(role: str, text: str) -> dict:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


def _call(call_id: str) -> dict:
    return {"role": "assistant", "parts": [{"type": "tool_call", "id": call_id, "name": "lookup", "arguments": {}}]}


def _request(*spans: dict, trace: str = TRACE) -> ExportTraceServiceRequest:
    """An export of `spans` ({id, start, attributes}) of one trace, as the SDK encodes it."""
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    for s in spans:
        span = scope.spans.add(
            trace_id=bytes.fromhex(trace),
            span_id=bytes.fromhex(s["id"]),
            name=s.get("name", "span"),
            start_time_unix_nano=s["start"],
            end_time_unix_nano=s["start"] + 10,
        )
        for key, value in s["attributes"].items():
            span.attributes.add(key=key).value.string_value = value
    return request


def _chat(span_id: str, start: int, inputs: list, output: dict, **extra: str) -> dict:
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps(inputs),
        "gen_ai.output.messages": json.dumps([output]),
        **extra,
    }
    return {"id": span_id, "start": start, "attributes": attributes}


def _tool(span_id: str, start: int, call_id: str, result: str, **extra: str) -> dict:
    attributes = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.call.result": result,
        **extra,
    }
    return {"id": span_id, "start": start, "attributes": attributes}


def _span_id(n: int) -> str:
    return f"{n + 1:016x}"


def _stored_span_bytes() -> int:
    """What the stored spans keep, as JSON bytes (on either database)."""
    return sum(len(json.dumps(data).encode()) for data in OtelSpan.objects.values_list("data", flat=True))


def test_a_parked_span_keeps_only_what_the_mapping_reads(deployment):
    blob = "x" * 2_000_000  # an attribute no mapping reads: a prompt cache dump, a raw HTTP body
    first = _chat(_span_id(0), 10, [_text("user", "Where is A1?")], _call("c1"), **{"app.debug.blob": blob})
    held = _tool(_span_id(1), 5, "c9", "a result waiting for its call", **{"app.debug.blob": blob})

    result = otlp_ingest(deployment=deployment, request=_request(first, held))

    assert result.rejected_spans == 0, result.error_message
    assert OtelSpan.objects.count() == 2
    # Two spans of 2 MB each leave their ids and the held tool result, not their attributes.
    assert _stored_span_bytes() < 1_000
    (parked,) = OtelSpan.objects.filter(held=True)
    assert parked.data == {"call_id": "c9", "name": "", "result": "a result waiting for its call"}


def test_a_span_over_the_per_span_bound_rejects_its_trace_alone_and_keeps_what_is_stored(
    client, deployment, ingest_key, settings
):
    settings.OTEL_SPAN_MAX_BYTES = 50_000
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ingest_key}"}
    other = "7e" * 16
    start = _request(_chat(_span_id(0), 10, [_text("user", "Where is A1?")], _call("c1")))
    assert (
        client.post(PATH, start.SerializeToString(), content_type="application/x-protobuf", **auth).status_code == 200
    )
    before = (Trace.objects.get().message_count, OtelSpan.objects.count(), OtelTrace.objects.get().stored_bytes)

    huge = _request(_tool(_span_id(1), 20, "c1", "y" * 3_000_000), _chat(_span_id(2), 30, [], _text("assistant", "ok")))
    # Another run the SDK batched into the same export.
    huge.resource_spans.extend(
        _request(_chat(_span_id(9), 10, [_text("user", "hi")], _text("assistant", "hello")), trace=other).resource_spans
    )
    answer = client.post(PATH, huge.SerializeToString(), content_type="application/x-protobuf", **auth)

    assert answer.status_code == 200
    partial = ExportTraceServiceResponse.FromString(answer.content).partial_success
    assert partial.rejected_spans == 2
    assert f"trace {TRACE}: span {_span_id(1)}" in partial.error_message
    assert "PRACTICUM_OTEL_SPAN_MAX_BYTES" in partial.error_message
    assert Trace.objects.get(external_id=other).message_count == 2
    mine = (
        Trace.objects.get(external_id=TRACE).message_count,
        OtelSpan.objects.filter(trace_id=TRACE).count(),
        OtelTrace.objects.get(external_id=TRACE).stored_bytes,
    )
    assert mine == before
    # The run goes on with spans inside the bound.
    fine = _request(_tool(_span_id(3), 20, "c1", "shipped"))
    assert client.post(PATH, fine.SerializeToString(), content_type="application/x-protobuf", **auth).status_code == 200
    assert [m.content for m in Trace.objects.get(external_id=TRACE).messages.order_by("position")][-1] == "shipped"


def test_a_trace_past_its_byte_bound_takes_no_more_spans_and_the_export_s_other_traces_land(deployment, settings):
    settings.OTEL_TRACE_MAX_BYTES = 100_000
    other = "7e" * 16
    for n in range(2):  # tool results whose calls never come: parked, 40 kB each
        otlp_ingest(deployment=deployment, request=_request(_tool(_span_id(n), 5 + n, f"c{n}", "z" * 40_000)))
    request = _request(_tool(_span_id(2), 7, "c2", "z" * 40_000))
    request.resource_spans.extend(
        _request(_chat(_span_id(9), 10, [_text("user", "hi")], _text("assistant", "hello")), trace=other).resource_spans
    )

    result = otlp_ingest(deployment=deployment, request=request)

    assert result.rejected_spans == 1 and f"trace {TRACE}" in result.error_message
    assert Trace.objects.filter(external_id=other).exists()
    state = OtelTrace.objects.get(external_id=TRACE)
    assert state.held == 2 and state.stored_bytes == 80_000
    assert OtelSpan.objects.filter(held=True).count() == 2


def test_a_parked_trace_over_its_bound_is_rejected_in_partial_success(client, deployment, ingest_key, settings):
    settings.OTEL_TRACE_MAX_BYTES = 100_000
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ingest_key}"}
    answers = []
    for n in range(3):
        body = _request(_tool(_span_id(n), 5 + n, f"c{n}", "z" * 40_000)).SerializeToString()
        answers.append(client.post(PATH, body, content_type="application/x-protobuf", **auth))

    assert [a.status_code for a in answers] == [200, 200, 200]
    partial = ExportTraceServiceResponse.FromString(answers[2].content).partial_success
    assert partial.rejected_spans == 1 and "PRACTICUM_OTEL_TRACE_MAX_BYTES" in partial.error_message
    assert OtelSpan.objects.filter(held=True).count() == 2  # what was parked stays


def _grow(deployment, turns: int) -> list[dict]:
    """A run of `turns` model calls, each exported alone, whose input repeats the run so far;
    returns the conversation as the next call's input would carry it."""
    history = [_text("user", "Start the audit.")]
    for n in range(turns):
        answer = _text("assistant", f"step {n} done")
        request = _request(_chat(_span_id(n), 100 * (n + 1), history, answer))
        assert otlp_ingest(deployment=deployment, request=request).rejected_spans == 0
        history = [*history, answer, _text("user", f"go on after {n}")]
    return history


@pytest.mark.parametrize("turns", [3, 60])
def test_an_export_that_extends_a_trace_reads_neither_its_earlier_spans_nor_its_messages(
    deployment, monkeypatch, turns
):
    history = _grow(deployment, turns)
    read = []
    span_read = ingest_module.span_read
    monkeypatch.setattr(ingest_module, "span_read", lambda span: read.append(span.span_id) or span_read(span))
    nxt = _request(
        _chat(_span_id(turns), 100 * (turns + 1), history, _call("c1")),
        _tool(_span_id(turns + 1), 100 * (turns + 1) + 50, "c1", "found"),
    )

    with CaptureQueriesContext(connection) as queries:
        result = otlp_ingest(deployment=deployment, request=nxt)

    assert result.rejected_spans == 0 and result.traces["appended"] == 1
    assert read == [_span_id(turns), _span_id(turns + 1)]  # the export's spans, parsed once each
    sql = [q["sql"] for q in queries.captured_queries]
    assert not [q for q in sql if q.lstrip().startswith("SELECT") and '"feedback_message"' in q]
    assert not [q for q in sql if '"feedback_otelspan"."data"' in q]
    # The same dozen statements however long the run is: 3 turns or 60.
    assert len(sql) <= 12, sql
    trace = Trace.objects.get()
    assert trace.message_count == 2 * turns + 1 + 2
    assert [m.role for m in trace.messages.order_by("-position")[:3]] == ["tool", "assistant", "user"]


def test_an_earlier_call_that_arrives_late_is_checked_against_the_turns_it_covers(deployment):
    history = _grow(deployment, 5)
    stored = Trace.objects.get().message_count
    late_same = _request(_chat(_span_id(40), 150, history[:3], _text("assistant", "step 1 done")))
    late_other = _request(_chat(_span_id(41), 160, history[:3], _text("assistant", "a different step 1")))

    assert otlp_ingest(deployment=deployment, request=late_same).rejected_spans == 0
    result = otlp_ingest(deployment=deployment, request=late_other)

    assert result.rejected_spans == 1 and "messages[3] differs from the stored message" in result.error_message
    assert Trace.objects.get().message_count == stored


def test_a_lost_state_is_read_again_from_the_stored_messages(deployment):
    history = _grow(deployment, 4)
    OtelTrace.objects.all().delete()  # expired: the run went on past the retention

    request = _request(_chat(_span_id(50), 10_000, history, _text("assistant", "all done")))
    result = otlp_ingest(deployment=deployment, request=request)

    assert result.rejected_spans == 0, result.error_message
    assert Trace.objects.get().messages.order_by("position").last().content == "all done"
    assert Trace.objects.get().message_count == len(history) + 1


def test_an_oversized_span_rejects_its_trace_before_anything_is_written(deployment, settings):
    settings.OTEL_SPAN_MAX_BYTES = 1_000
    result = otlp_ingest(
        deployment=deployment,
        request=_request(_chat(_span_id(0), 10, [_text("user", "q" * 5_000)], _text("assistant", "a"))),
    )
    assert result.rejected_spans == 1 and "PRACTICUM_OTEL_SPAN_MAX_BYTES" in result.error_message
    assert not Trace.objects.exists() and not OtelSpan.objects.exists() and not OtelTrace.objects.exists()


def test_metadata_and_tool_definitions_count_toward_the_span_bound(deployment, settings):
    settings.OTEL_SPAN_MAX_BYTES = 10_000
    span = _chat(_span_id(0), 10, [_text("user", "hi")], _text("assistant", "hello"))
    span["attributes"]["metadata"] = json.dumps({"notes": "n" * 20_000})  # OpenInference's run metadata
    result = otlp_ingest(deployment=deployment, request=_request(span))
    assert result.rejected_spans == 1 and f"span {_span_id(0)}" in result.error_message

    settings.OTEL_SPAN_MAX_BYTES = 100_000
    assert otlp_ingest(deployment=deployment, request=_request(span)).rejected_spans == 0
    assert Trace.objects.get().metadata["notes"] == "n" * 20_000
    assert "metadata" not in OtelTrace.objects.get().summary  # the trace holds it, not the state


def test_a_small_export_after_large_parked_spans_costs_what_it_carries(deployment):
    """The issue's case: tool results parked near the span bound, then a 390-byte export."""
    import tracemalloc

    for n in range(10):
        parked = _request(_tool(_span_id(n), 5 + n, f"c{n}", "r" * 900_000))
        assert otlp_ingest(deployment=deployment, request=parked).rejected_spans == 0
    small = _request({"id": _span_id(20), "start": 50, "attributes": {"http.route": "/orders"}})
    assert small.ByteSize() < 400

    tracemalloc.start()
    result = otlp_ingest(deployment=deployment, request=small)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    assert result.rejected_spans == 0 and result.traces["held"] == 1
    assert peak < 1_000_000  # 9 MB parked; before, each export re-read and parsed all of it


def test_a_held_result_is_not_counted_again_against_the_call_that_takes_it(deployment, settings):
    settings.OTEL_SPAN_MAX_BYTES = 100_000
    parked = _request(_tool(_span_id(0), 5, "c1", "r" * 90_000))
    assert otlp_ingest(deployment=deployment, request=parked).rejected_spans == 0

    call = _request(_chat(_span_id(1), 10, [_text("user", "u" * 20_000)], _call("c1")))
    result = otlp_ingest(deployment=deployment, request=call)

    assert result.rejected_spans == 0 and result.traces["created"] == 1
    assert [m.role for m in Trace.objects.get().messages.order_by("position")] == ["user", "assistant", "tool"]
    assert not OtelSpan.objects.filter(held=True).exists() and OtelTrace.objects.get().held == 0


def test_times_past_64_bits_and_unusual_metadata_are_answered_not_a_500(client, deployment, ingest_key):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ingest_key}"}

    def post(*spans: dict, trace: str = TRACE) -> ExportTraceServiceResponse:
        answer = client.post(PATH, _request(*spans, trace=trace).SerializeToString(), "application/x-protobuf", **auth)
        assert answer.status_code == 200, answer.content
        return ExportTraceServiceResponse.FromString(answer.content).partial_success

    assert post(_chat(_span_id(0), 10, [_text("user", "hi")], _text("assistant", "ok"))).rejected_spans == 0
    late = 2**64 - 20  # the protocol's unsigned nanoseconds, past the year 2262
    history = [_text("user", "hi"), _text("assistant", "ok"), _text("user", "more")]
    assert post(_chat(_span_id(1), late, history, _text("assistant", "ok2"))).rejected_spans == 0
    assert (
        post(_chat(_span_id(0), late, [_text("user", "hi")], _text("assistant", "ok")), trace="5a" * 16).rejected_spans
        == 0
    )
    assert Trace.objects.get(external_id=TRACE).message_count == 4

    big = _chat(
        _span_id(0), 10, [_text("user", "hi")], _text("assistant", "ok"), metadata='{"big": 18446744073709551616}'
    )
    assert post(big, trace="5b" * 16).rejected_spans == 0
    assert float(Trace.objects.get(external_id="5b" * 16).metadata["big"]) == 2.0**64  # as the batch API reads it

    def deep(n: int) -> str:
        return '{"a":' * n + "1" + "}" * n

    for depth in (150, 300):  # on a stored trace and on one still held
        for trace in (TRACE, "5c" * 16):
            tool = _tool(_span_id(depth), 20, "", "x", metadata=deep(depth), **{"gen_ai.tool.name": "t"})
            partial = post(tool, trace=trace)
            assert partial.rejected_spans == 1
            assert "metadata: nested more than 64 levels deep" in partial.error_message
    assert "a" not in Trace.objects.get(external_id=TRACE).metadata
    assert not OtelTrace.objects.filter(external_id="5c" * 16).exists()


def test_tool_definitions_and_metadata_every_call_repeats_count_once_toward_the_trace_bound(deployment, settings):
    settings.OTEL_TRACE_MAX_BYTES = 60_000
    tools = [
        {"type": "function", "function": {"name": f"tool{i}", "description": "d" * 900, "parameters": {}}}
        for i in range(20)
    ]
    extra = {"gen_ai.tool.definitions": json.dumps(tools), "metadata": json.dumps({"notes": "n" * 10_000})}
    history = [_text("user", "hi")]
    for n in range(6):  # each call carries the same 30 kB again; stored once, they count once
        answer = _text("assistant", f"answer {n}")
        result = otlp_ingest(
            deployment=deployment, request=_request(_chat(_span_id(n), 10 * (n + 1), history, answer, **extra))
        )
        assert result.rejected_spans == 0, result.error_message
        history = [*history, answer, _text("user", f"q{n}")]

    trace = Trace.objects.get()
    assert trace.message_count == 12 and len(trace.tools) == 20
    stored = sum(len(json.dumps(raw).encode()) for raw in trace.messages.values_list("raw", flat=True))
    assert OtelTrace.objects.get().stored_bytes < stored + 35_000
    # New metadata still counts.
    settings.OTEL_TRACE_MAX_BYTES = OtelTrace.objects.get().stored_bytes + 5_000
    grown = _chat(_span_id(9), 100, history, _text("assistant", "end"), metadata=json.dumps({"more": "m" * 10_000}))
    result = otlp_ingest(deployment=deployment, request=_request(grown))
    assert result.rejected_spans == 1 and "PRACTICUM_OTEL_TRACE_MAX_BYTES" in result.error_message


@pytest.mark.django_db(transaction=True)
def test_upgrading_keeps_the_tool_results_the_earlier_release_was_holding():
    from django.db.migrations.executor import MigrationExecutor
    from django.utils import timezone

    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    executor = MigrationExecutor(connection)
    executor.migrate([("feedback", "0020_judge_correction_mode")])
    old = executor.loader.project_state([("feedback", "0020_judge_correction_mode")]).apps
    OldSpan = old.get_model("feedback", "OtelSpan")
    deployment_id = old.get_model("serving", "Deployment").objects.create(name="support-bot").pk

    def whole(span_id: str, start: int, attributes: dict) -> None:  # a span as the earlier release kept it
        data = {"name": "span", "parent": "", "end_ns": start + 10, "error": False, "attributes": attributes}
        OldSpan.objects.create(
            deployment_id=deployment_id,
            trace_id=TRACE,
            span_id=span_id,
            start_ns=start,
            data={**data, "events": [], "resource": {}},
            received_at=timezone.now(),
        )

    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": "c1"}
    whole(_span_id(0), 15, {**tool, "gen_ai.tool.call.result": "REFUND ISSUED #R-7781", "app.blob": "x" * 5_000})
    whole(_span_id(1), 16, {"http.route": "/refunds", "app.blob": "x" * 5_000})

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(leaves)

    from training.serving.models import Deployment

    assert _stored_span_bytes() < 200  # what no mapping reads is gone
    result = otlp_ingest(
        deployment=Deployment.objects.get(pk=deployment_id),
        request=_request(_chat(_span_id(2), 10, [_text("user", "refund ORD-1000")], _call("c1"))),
    )

    assert result.rejected_spans == 0, result.error_message
    messages = Trace.objects.get().messages.order_by("position")
    assert [(m.role, m.content) for m in messages][-1] == ("tool", "REFUND ISSUED #R-7781")
    assert not OtelSpan.objects.filter(held=True).exists()


def test_a_tool_span_after_the_call_that_repeats_its_result_keeps_the_stored_words_and_the_export(deployment):
    asked = _chat(_span_id(0), 10, [_text("user", "Where is ORD-1000?")], _call("c1"))
    repeated = {
        "role": "tool",
        "id": "c1",
        "parts": [{"type": "tool_call_response", "id": "c1", "response": "shipped"}],
    }
    final = _chat(
        _span_id(2), 30, [_text("user", "Where is ORD-1000?"), _call("c1"), repeated], _text("assistant", "It shipped")
    )
    assert otlp_ingest(deployment=deployment, request=_request(asked, final)).rejected_spans == 0

    # The tool's own span, later, in words other than the input's, with the run's next call.
    nxt = _chat(_span_id(3), 40, [], _text("assistant", "Anything else?"))
    result = otlp_ingest(
        deployment=deployment, request=_request(_tool(_span_id(1), 20, "c1", '{"status": "shipped"}'), nxt)
    )

    assert result.rejected_spans == 0
    assert f"span {_span_id(1)}: the result of call c1 differs" in result.error_message
    messages = list(Trace.objects.get().messages.order_by("position").values_list("role", "content"))
    assert messages[2:] == [("tool", "shipped"), ("assistant", "It shipped"), ("assistant", "Anything else?")]
