"""What a role may see and do on a trace: customers' words and references only with the
permission to read customer feedback; a queue item is done only by the one holding it."""

from __future__ import annotations

import pytest

from feedback.models import JudgeResult, JudgeStatus, QueueItemStatus, Trace
from feedback.services.customer_feedback import customer_feedback_create
from feedback.services.queues import queue_create, queue_next_item
from tests.factories import user_with_role
from tests.feedback.conftest import TOOLS, tool_conversation

pytestmark = pytest.mark.django_db
WORDS = "my card was charged twice for the blender"
REF = "cust-secret-4711"


@pytest.fixture
def trace_with_feedback(ingest, deployment):
    trace = ingest(deployment, {"external_id": "fb", "tools": TOOLS, "messages": tool_conversation()})[0]
    customer_feedback_create(
        deployment=deployment,
        data={"trace_id": trace.id, "rating": "down", "comment": WORDS, "customer_ref": REF},
    )
    customer_feedback_create(
        deployment=deployment,
        data={"response_id": "chatcmpl-42", "rating": 1, "correction": WORDS + " (turn)", "customer_ref": REF},
    )
    return trace


def test_a_reviewer_holding_the_item_sees_the_conversation_but_not_the_customers_words(
    client, trace_with_feedback, operator, reviewer
):
    queue = queue_create(name="q", traces=Trace.objects.all(), filters={}, created_by=operator)
    item = queue_next_item(queue=queue, user=reviewer)
    client.force_login(reviewer)
    page = client.get(f"/queues/{queue.pk}/items/{item.pk}/").content.decode()
    assert "Where is order A1?" in page
    assert WORDS not in page and REF not in page

    client.force_login(operator)
    page = client.get(f"/traces/{trace_with_feedback.id}/").content.decode()
    assert WORDS in page and REF in page


def test_an_approver_reads_traces_and_judgements_without_the_customers_words(client, trace_with_feedback):
    trace = trace_with_feedback
    answer = trace.messages.get(position=4)
    result = JudgeResult.objects.create(
        trace=trace, message=answer, trigger="customer_feedback", status=JudgeStatus.SUCCEEDED, reward=0.2
    )
    result.customer_feedback.set(trace.customer_feedback.all())
    client.force_login(user_with_role("approver", "april"))
    for url in (f"/traces/{trace.id}/", f"/judge/results/{result.id}/"):
        response = client.get(url)
        assert response.status_code == 200, url
        body = response.content.decode()
        assert WORDS not in body and REF not in body, url


def test_a_reviewer_cannot_mark_done_an_item_they_do_not_hold(client, trace_with_feedback, operator, reviewer):
    queue = queue_create(name="q", traces=Trace.objects.all(), filters={}, created_by=operator)
    item = queue.items.get()
    client.force_login(reviewer)
    response = client.post(f"/queues/{queue.pk}/items/{item.pk}/done")
    assert response.status_code == 302
    item.refresh_from_db()
    assert item.status == QueueItemStatus.PENDING and item.done_by is None

    held = queue_next_item(queue=queue, user=reviewer)
    client.post(f"/queues/{queue.pk}/items/{held.pk}/done")
    held.refresh_from_db()
    assert held.status == QueueItemStatus.DONE and held.done_by == reviewer
