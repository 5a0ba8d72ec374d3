"""A queue's instructions, rubric and score dimensions (as Langfuse score configs), shown on
every item with the item's task — the user's request — and each reviewer's scores stored per
dimension."""

from __future__ import annotations

import pytest

from feedback.models import AnnotationQueue, QueueScore, ScoreDimension
from feedback.services.queue_scores import queue_item_scores_save, queue_rubric_set, score_dimensions_parse
from feedback.services.queues import QueueItemNotHeld, queue_next_item
from tests.factories import user_with_role
from webapp.kernel.chat_format import FieldError

pytestmark = pytest.mark.django_db
DIMENSIONS = """helpfulness: numeric 1-5 | How far the answer solved the customer's problem
Error type: Categorical wrong-tool, wrong-order, rude, none | The main failure
resolved: boolean | The request was fully handled"""


@pytest.fixture
def queue(deployment, ingest, operator_client):
    ingest(
        deployment,
        *[
            {
                "external_id": f"neg-{i}",
                "messages": [
                    {"role": "system", "content": "You are Acme's support agent."},
                    {"role": "user", "content": f"Refund order A{i} <b>now</b>, it arrived broken"},
                    {"role": "assistant", "content": "Sorry to hear that."},
                ],
            }
            for i in range(3)
        ],
    )
    response = operator_client.post(
        "/queues/new",
        {
            "name": "Refund complaints",
            "limit": 10,
            "lock_minutes": 10,
            "q": "refund",
            "instructions": "Read what the customer asked, then whether the agent refunded the right order.",
            "rubric": "5: refunded the order asked about, within policy.\n1: refunded another order.",
            "dimensions": DIMENSIONS,
        },
    )
    assert response.status_code == 302
    return AnnotationQueue.objects.get()


def test_dimensions_are_read_one_a_line_and_a_bad_line_is_named():
    helpfulness, error, resolved = score_dimensions_parse(DIMENSIONS)
    assert (helpfulness.name, helpfulness.kind, helpfulness.min_value, helpfulness.max_value) == (
        "helpfulness",
        "numeric",
        1.0,
        5.0,
    )
    assert (error.name, error.categories) == ("error_type", ["wrong-tool", "wrong-order", "rude", "none"])
    assert (resolved.kind, resolved.description) == ("boolean", "The request was fully handled")
    for text, reason in [
        ("ok: numeric\n", "line 1: a numeric dimension needs its range"),
        ("a: boolean\nb: numeric 5-1", "line 2: the range 5-1 is empty"),
        ("a: categorical yes", "line 1: a categorical dimension needs at least two categories"),
        ("a: boolean\n\na: boolean", "line 3: 'a' is named twice"),
        ("a: stars 1-5", "line 1: the type 'stars' is not one of numeric, categorical, boolean"),
        ("just words", "line 1: write it as"),
    ]:
        with pytest.raises(FieldError) as refused:
            score_dimensions_parse(text)
        assert refused.value.field == "dimensions" and refused.value.reason.startswith(reason), refused.value.reason


def test_a_reviewer_sees_the_task_instructions_and_rubric_and_scores_each_dimension(client, queue):
    reviewer = user_with_role("reviewer", "rita")
    client.force_login(reviewer)
    assert [d.name for d in ScoreDimension.objects.filter(queue=queue)] == ["helpfulness", "error_type", "resolved"]
    item = queue_next_item(queue=queue, user=reviewer)
    page = client.get(f"/queues/{queue.pk}/items/{item.pk}/").content.decode()
    # The user's request opens the item, escaped, before the conversation.
    task = page.index('id="queue-task"')
    assert task < page.index('class="conversation"')
    assert f"Refund order A{item.trace.external_id[-1]} &lt;b&gt;now&lt;/b&gt;, it arrived broken" in page[task:]
    assert "refunded the right order" in page and "5: refunded the order asked about" in page
    assert 'name="score-helpfulness" min="1.0" max="5.0" step="1"' in page
    assert page.count('name="score-error_type"') == 4 and page.count('name="score-resolved"') == 2

    url = f"/queues/{queue.pk}/items/{item.pk}/scores"
    saved = client.post(
        url,
        {"score-helpfulness": "2", "score-error_type": "wrong-order", "score-resolved": "no"},
        HTTP_HX_REQUEST="true",
    )
    assert saved.status_code == 200 and "Saved." in saved.content.decode()
    scores = {s.dimension.name: (s.value, s.label) for s in QueueScore.objects.select_related("dimension")}
    assert scores == {"helpfulness": (2.0, ""), "error_type": (None, "wrong-order"), "resolved": (0.0, "no")}
    assert "3 of 3 scored by you" in saved.content.decode()

    # A score outside its range is refused beside its dimension, and nothing else changes.
    refused = client.post(url, {"score-helpfulness": "7", "score-resolved": "yes"}, HTTP_HX_REQUEST="true")
    body = refused.content.decode()
    assert refused.status_code == 400 and "helpfulness: 7 is outside 1-5" in body and 'aria-invalid="true"' in body
    assert QueueScore.objects.get(dimension__name="resolved").label == "no"
    # Scoring again replaces the reviewer's score; a cleared answer removes it.
    client.post(url, {"score-helpfulness": "4", "score-resolved": ""}, HTTP_HX_REQUEST="true")
    scores = {s.dimension.name: s.value for s in QueueScore.objects.select_related("dimension")}
    assert scores == {"helpfulness": 4.0, "error_type": None}

    detail = client.get(f"/queues/{queue.pk}/").content.decode()
    assert "mean 4.00" in detail and "wrong-order 1" in detail


def test_only_the_reviewer_holding_or_who_finished_an_item_scores_it(queue):
    rita, rob = user_with_role("reviewer", "rita"), user_with_role("reviewer", "rob")
    item = queue_next_item(queue=queue, user=rita)
    with pytest.raises(QueueItemNotHeld):
        queue_item_scores_save(item=item, user=rob, values={"resolved": "yes"})
    with pytest.raises(FieldError) as refused:
        queue_item_scores_save(item=item, user=rita, values={"stars": "5"})
    assert refused.value.field == "scores.stars"
    queue_item_scores_save(item=item, user=rita, values={"resolved": "yes", "error_type": "none"})
    assert QueueScore.objects.filter(user=rita).count() == 2


def test_the_rubric_can_be_reworded_but_scored_dimensions_keep_their_meaning(queue, operator_client):
    rita = user_with_role("reviewer", "rita")
    item = queue_next_item(queue=queue, user=rita)
    queue_item_scores_save(item=item, user=rita, values={"helpfulness": "3"})
    with pytest.raises(FieldError, match="'helpfulness' holds 1 score: it cannot be removed"):
        queue_rubric_set(queue=queue, instructions="", rubric="", dimensions="resolved: boolean")
    with pytest.raises(FieldError, match="type and range cannot change"):
        queue_rubric_set(queue=queue, instructions="", rubric="", dimensions="helpfulness: numeric 0-10")

    # Over HTTP a refused edit keeps what was typed, with the error beside its field.
    typed = "helpfulness: numeric 1-5 | Reworded\ntone: categorical warm, curt"
    page = operator_client.post(
        f"/queues/{queue.pk}/rubric", {"instructions": "New words", "rubric": "r", "dimensions": typed + "\nx: nope"}
    )
    assert page.status_code == 400 and "line 3: the type &#x27;nope&#x27;" in page.content.decode()
    assert "Reworded" in page.content.decode()
    assert (
        operator_client.post(
            f"/queues/{queue.pk}/rubric", {"instructions": "New words", "rubric": "r", "dimensions": typed}
        ).status_code
        == 302
    )
    queue.refresh_from_db()
    assert queue.instructions == "New words"
    dims = list(ScoreDimension.objects.filter(queue=queue))
    assert [(d.name, d.description) for d in dims] == [("helpfulness", "Reworded"), ("tone", "")]
    assert QueueScore.objects.get().dimension.name == "helpfulness"
    # Reviewers may work queues, not edit them.
    from django.test import Client

    reviewer = Client()
    reviewer.force_login(rita)
    assert reviewer.post(f"/queues/{queue.pk}/rubric", {"dimensions": ""}).status_code == 403
