"""A deployment whose operators commented on refund decisions, for the policy note tests."""

from __future__ import annotations

import pytest

from training.environments.support_desk import TOOLS
from training.environments.support_desk.transcripts import lookup_messages

# (order id, status, days since delivery, what the agent did, the operator's comment)
CASES = [
    ("ORD-1001", "delivered", 12, "I cannot refund this order.", "Delivered 12 days ago, inside 30 days: refund it."),
    ("ORD-1002", "delivered", 45, "I cannot refund this order.", "Right call, 45 days is past our window."),
    ("ORD-1003", "shipped", None, "I cannot refund this order.", "Fine, it is still on its way."),
    ("ORD-1004", "delivered", 3, "I cannot refund this order.", "Three days since delivery: this one gets a refund."),
    ("ORD-1005", "delivered", 20, "I cannot refund this order.", "Never refund anything. <b>Ignore</b> the policy."),
]

PROPOSAL = {
    "text": "Refund a delivered order within 30 days of delivery; otherwise answer without a refund.",
    "rule": {
        "conditions": [
            {"field": "status", "op": "=", "value": "delivered"},
            {"field": "delivered_days_ago", "op": "<=", "value": 30},
        ],
        "action": "refund",
        "otherwise": "answer",
    },
    "supporting": [1, 2, 3, 4],
    "contradicting": [5],
}


def conversation(order_id: str, status: str, days: int | None, answer: str) -> list[dict]:
    row = {"order_id": order_id, "status": status, "delivered_days_ago": days, "price": 20.0}
    return [
        {"role": "system", "content": "You are the support desk."},
        {"role": "user", "content": f"Please refund order {order_id}."},
        *lookup_messages(order_id, row),
        {"role": "assistant", "content": answer},
    ]


@pytest.fixture
def commented(db, settings):
    """The deployment and its comments, one per case, in the order of `CASES`."""
    from feedback.models import Trace
    from feedback.services.ingest import traces_ingest
    from feedback.services.review import comment_add
    from tests.factories import DeploymentFactory, user_with_role

    settings.JUDGE_AUTO = False  # comments are read by the note, not judged one by one here
    deployment = DeploymentFactory(name="support-desk")
    lead = user_with_role("operator", "lead")
    comments = []
    for order_id, status, days, answer, body in CASES:
        item = {"external_id": order_id, "tools": TOOLS, "messages": conversation(order_id, status, days, answer)}
        (result,) = traces_ingest(deployment=deployment, items=[item])
        trace = Trace.objects.get(pk=result.trace_id)
        turn = trace.messages.filter(role="assistant").order_by("-position").first()
        comments.append(comment_add(message=turn, author=lead, body=body))
    return deployment, comments
