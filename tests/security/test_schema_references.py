"""Tool definitions are trace data: a `$ref` in their parameters never makes the project
fetch anything (no http, no file:, no relative reference), wherever a schema is used."""

from __future__ import annotations

import pytest

from feedback.failure_modes.detectors import INVALID_TOOL_ARGS, TraceView, detect_invalid_tool_args
from feedback.judge.schemas import SchemaViolation, validate
from feedback.services.review import correction_add
from tests.factories import user_with_role
from tests.security.conftest import recording_server


@pytest.fixture
def fetch_server():
    """A real HTTP server that serves a schema and records every request it gets."""
    server, seen = recording_server(status=200, body=b'{"type": "string"}', content_type="application/schema+json")
    yield f"http://127.0.0.1:{server.server_port}", seen
    server.shutdown()


def tools_with(ref: str) -> list[dict]:
    return [
        {
            "type": "function",
            "function": {
                "name": "lookup_order",
                "parameters": {"type": "object", "properties": {"order_id": {"$ref": ref}}},
            },
        }
    ]


def call(arguments: str) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": "lookup_order", "arguments": arguments}}


def test_a_correction_never_fetches_a_reference_from_the_traces_tools(db, fetch_server, tmp_path, ingest):
    from tests.factories import DeploymentFactory

    url, hits = fetch_server
    local = tmp_path / "schema.json"
    local.write_text('{"type": "string"}')
    deployment = DeploymentFactory(name="refs")
    operator = user_with_role("operator", "olga")
    for n, ref in enumerate([f"{url}/remote.json", local.as_uri(), "relative.json"]):
        trace = ingest(
            deployment,
            {
                "external_id": f"refs-{n}",
                "tools": tools_with(ref),
                "messages": [{"role": "user", "content": "where is A1?"}, {"role": "assistant", "content": "?"}],
            },
        )[0]
        message = trace.messages.get(position=1)
        # Had the schema been fetched ({"type": "string"}), the number would be refused.
        correction = correction_add(message=message, author=operator, tool_calls=[call('{"order_id": 7}')])
        assert correction.tool_calls[0]["function"]["name"] == "lookup_order"
    assert hits == []


def test_failure_mode_detectors_never_fetch_a_reference(fetch_server, tmp_path):
    url, hits = fetch_server
    local = tmp_path / "schema.json"
    local.write_text('{"type": "string"}')
    for ref in (f"{url}/detector.json", local.as_uri(), f"ftp://127.0.0.1:1/{tmp_path.name}.json"):
        view = TraceView(
            trace_id=1,
            messages=[{"role": "assistant", "content": None, "tool_calls": [call('{"order_id": 7}')]}],
            tools=tools_with(ref),
        )
        findings = detect_invalid_tool_args(view)
        assert [f for f in findings if f.kind == INVALID_TOOL_ARGS] == []
    assert hits == []


def test_the_one_validator_factory_refuses_outside_references_and_keeps_inside_ones(fetch_server):
    from feedback.schema_validation import UnusableSchema, schema_first_error, schema_validator

    url, hits = fetch_server
    with pytest.raises(UnusableSchema, match="outside itself"):
        schema_first_error(schema_validator({"$ref": f"{url}/x.json"}), 1)
    with pytest.raises(UnusableSchema, match="outside itself"):
        schema_first_error(schema_validator({"$id": f"{url}/base/", "items": {"$ref": "item.json"}}), [1])
    inside = schema_validator({"$defs": {"id": {"type": "string"}}, "properties": {"x": {"$ref": "#/$defs/id"}}})
    assert "is not of type 'string'" in schema_first_error(inside, {"x": 1}).message
    with pytest.raises(SchemaViolation):
        validate(1, {"$ref": f"{url}/judge.json"})
    assert hits == []
