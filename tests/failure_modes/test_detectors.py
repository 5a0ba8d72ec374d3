"""The cheap detectors, one trace at a time and over a batch."""

from __future__ import annotations

import math

from feedback.failure_modes.detectors import (
    EMPTY_ANSWER,
    INVALID_TOOL_ARGS,
    LENGTH_OUTLIER,
    REFUSAL,
    TOOL_ERROR,
    TRUNCATED,
    TraceView,
    detect_batch,
    modified_z_scores,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string", "pattern": "^[A-Z][0-9]+$"}},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    }
]


def call(args: str, name: str = "lookup_order") -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": name, "arguments": args}}],
    }


def trace(*messages, trace_id=1, tools=TOOLS) -> TraceView:
    return TraceView(trace_id=trace_id, messages=[{"role": "user", "content": "Where is A1?"}, *messages], tools=tools)


def kinds(view: TraceView) -> list[tuple[str, int]]:
    return [(f.kind, f.position) for f in detect_batch([view]).get(view.trace_id, [])]


def test_a_clean_tool_trace_has_no_findings():
    view = trace(
        call('{"order_id": "A1"}'),
        {"role": "tool", "tool_call_id": "c1", "content": '{"status": "shipped"}'},
        {"role": "assistant", "content": "It has shipped.", "finish_reason": "stop"},
    )
    assert kinds(view) == []


def test_tool_errors_in_json_and_text():
    for content in ('{"error": "order not found"}', '{"status": "failed"}', "Traceback (most recent call last):\n..."):
        view = trace(call('{"order_id": "A1"}'), {"role": "tool", "tool_call_id": "c1", "content": content})
        assert kinds(view) == [(TOOL_ERROR, 2)], content
    ok = trace(call('{"order_id": "A1"}'), {"role": "tool", "tool_call_id": "c1", "content": '{"error": null}'})
    assert kinds(ok) == []


def test_invalid_tool_arguments_against_the_schema():
    cases = {
        '{"order_id": 17}': "order_id: 17 is not of type 'string'",
        '{"order_id": "a1"}': "does not match",
        "{}": "'order_id' is a required property",
        '{"order_id": "A1", "force": true}': "Additional properties",
        '{"order_id": "A1"': "not JSON",
        "[1]": "not a JSON object",
    }
    for args, expected in cases.items():
        (finding,) = detect_batch([trace(call(args))])[1]
        assert finding.kind == INVALID_TOOL_ARGS and finding.position == 1
        assert expected in finding.detail, (args, finding.detail)
    (finding,) = detect_batch([trace(call("{}", name="delete_everything"))])[1]
    assert "undefined tool 'delete_everything'" in finding.detail


def test_empty_truncated_and_refused_answers():
    assert kinds(trace({"role": "assistant", "content": "   "})) == [(EMPTY_ANSWER, 1)]
    cut = {"role": "assistant", "content": "Your order A1 was shipped on", "finish_reason": "length"}
    assert kinds(trace(cut)) == [(TRUNCATED, 1)]
    for text in ("I'm sorry, but I can't help with that.", "As an AI language model, I cannot do that."):
        assert kinds(trace({"role": "assistant", "content": text})) == [(REFUSAL, 1)]
    assert kinds(trace({"role": "assistant", "content": "I can help with that: it shipped."})) == []


def test_length_outliers_against_the_batch():
    rng_lengths = [40 + (i * 7) % 30 for i in range(50)]
    views = [
        TraceView(trace_id=i, messages=[{"role": "assistant", "content": "x" * n}], group="bot")
        for i, n in enumerate(rng_lengths)
    ]
    views.append(TraceView(trace_id=99, messages=[{"role": "assistant", "content": "y" * 5000}], group="bot"))
    found = detect_batch(views)
    assert list(found) == [99]
    assert found[99][0].kind == LENGTH_OUTLIER and "unusually long: 5000 characters" in found[99][0].detail
    # Another deployment's answers are not the yardstick, and a small group is not judged.
    other = TraceView(trace_id=100, messages=[{"role": "assistant", "content": "z" * 5000}], group="other")
    assert 100 not in detect_batch([*views, other])


def test_modified_z_by_hand():
    # median 3, absolute deviations (2, 1, 0, 1, 97) -> MAD 1; z = 0.6745 * (x - 3).
    assert modified_z_scores([1, 2, 3, 4, 100]) == [0.6745 * -2, 0.6745 * -1, 0.0, 0.6745, 0.6745 * 97]


def test_a_templated_agent_gets_only_its_real_length_outliers():
    # Mostly templated answers (26-30 characters) make the MAD of log lengths tiny; the
    # agent's other, ordinary replies (60-120) are not outliers, a 2,000-character essay and
    # a two-character answer are.
    lengths = [26 + i % 5 for i in range(50)] + [60 + 3 * i for i in range(20)] + [2000, 2100, 2, 3]
    views = [
        TraceView(trace_id=i, messages=[{"role": "assistant", "content": "x" * n}], group="bot")
        for i, n in enumerate(lengths)
    ]
    assert len(lengths) == 74
    found = detect_batch(views)
    assert sorted(found) == [70, 71, 72, 73]
    directions = [found[i][0].detail.split(":")[0] for i in (70, 72)]
    assert directions == ["unusually long", "unusually short"]
    # Without the floor on the spread, the ordinary replies were flagged too.
    z = modified_z_scores([math.log1p(n) for n in lengths])
    assert sum(abs(v) > 3.5 for v in z) >= 20
