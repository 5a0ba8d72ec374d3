from __future__ import annotations

import pytest

from tests.feedback.conftest import TOOLS, tool_conversation

VALID_JUDGEMENT = {
    "rubric": {
        "criteria": [
            {"criterion": "Looks up the order before answering about its status", "weight": 3},
            {"criterion": "Gives the tracking number when the order has shipped", "weight": 2},
        ]
    },
    "rationale": "The operator says the agent guessed the status instead of calling lookup_order.",
    "reward": 0.2,
    "corrected_response": "Let me check order A1 for you.",
}


@pytest.fixture
def deployment(db):
    from tests.factories import DeploymentFactory

    return DeploymentFactory(name="support-bot")


@pytest.fixture
def make_trace(deployment):
    """Store a support conversation through the real ingest service."""
    from feedback.models import Trace
    from feedback.services.ingest import traces_ingest

    def make(external_id: str = "conv-1", answer: str = "It has shipped.", **extra) -> Trace:
        item = {"external_id": external_id, "tools": TOOLS, "messages": tool_conversation(answer=answer), **extra}
        (result,) = traces_ingest(deployment=deployment, items=[item])
        assert result.status == "created", result.as_dict()
        return Trace.objects.get(pk=result.trace_id)

    return make


@pytest.fixture
def operator(db):
    from tests.factories import user_with_role

    return user_with_role("operator", "olga")
