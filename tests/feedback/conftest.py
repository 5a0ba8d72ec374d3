from __future__ import annotations

import pytest

from feedback.services.api_keys import api_key_create
from tests.factories import DeploymentFactory


@pytest.fixture
def deployment(db):
    return DeploymentFactory(name="support-bot")


@pytest.fixture
def make_key(db):
    def make(deployment, scopes=("ingest",), **kwargs) -> str:
        return api_key_create(deployment=deployment, scopes=list(scopes), **kwargs).plaintext

    return make


@pytest.fixture
def ingest_key(deployment, make_key) -> str:
    return make_key(deployment, ["ingest", "read"])


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Find an order by id",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "refund",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}, "amount": {"type": "number", "minimum": 0}},
                "required": ["order_id", "amount"],
            },
        },
    },
]


def tool_conversation(question: str = "Where is order A1?", answer: str = "It has shipped.") -> list[dict]:
    return [
        {"role": "system", "content": "You are Acme's support agent."},
        {"role": "user", "content": question},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup_order", "arguments": '{"order_id": "A1"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"status": "shipped"}'},
        {"role": "assistant", "content": answer, "response_id": "chatcmpl-42"},
    ]


@pytest.fixture
def ingest(db):
    """Store traces through the real ingest service and build their search vectors, as the
    worker would after commit (test transactions never commit)."""
    from feedback.models import Trace
    from feedback.services.ingest import traces_ingest
    from feedback.services.search import traces_search_index

    def do(deployment, *items) -> list[Trace]:
        results = traces_ingest(deployment=deployment, items=list(items))
        assert all(r.status == "created" for r in results), [r.as_dict() for r in results]
        traces_search_index(trace_ids=[r.trace_id for r in results])
        return [Trace.objects.get(pk=r.trace_id) for r in results]

    return do


@pytest.fixture
def tool_trace(deployment, ingest):
    return ingest(deployment, {"external_id": "conv-1", "tools": TOOLS, "messages": tool_conversation()})[0]


@pytest.fixture
def operator(db):
    from tests.factories import user_with_role

    return user_with_role("operator", "olga")


@pytest.fixture
def reviewer(db):
    from tests.factories import user_with_role

    return user_with_role("reviewer", "rita")


@pytest.fixture
def operator_client(client, operator):
    client.force_login(operator)
    return client
