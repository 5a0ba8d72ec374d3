"""/api/v1/traces/<id>/comments and /ratings: a script writes an operator's words on a turn
as that person, reads them back, and rates turns; a deployment key may read, never write."""

from __future__ import annotations

import pytest

from feedback.models import Comment, TurnRating
from tests.factories import MessageFactory, TraceFactory, user_with_role

pytestmark = pytest.mark.django_db


@pytest.fixture
def trace(deployment):
    trace = TraceFactory(deployment=deployment, external_id="conv-1")
    MessageFactory(trace=trace, position=0, role="user", content="Refund A1?")
    MessageFactory(trace=trace, position=1, role="assistant", content="Refunded <b>A2</b>.")
    return trace


def test_an_operator_comments_on_a_turn_and_anyone_who_reads_the_trace_sees_it(client, trace, ingest_key):
    client.force_login(user_with_role("operator", "olga"))

    answer = client.post(
        f"/api/v1/traces/{trace.pk}/comments",
        {"position": 1, "body": "Refunded the wrong order: A1 was asked for.", "quote": "A2"},
        content_type="application/json",
    )

    assert answer.status_code == 201, answer.content
    made = answer.json()
    assert (made["position"], made["author"], made["quote"]) == (1, "olga", "A2")
    trace.refresh_from_db()
    assert trace.has_comment and Comment.objects.get().body.startswith("Refunded the wrong order")
    listed = client.get(f"/api/v1/traces/{trace.pk}/comments", HTTP_AUTHORIZATION=f"Bearer {ingest_key}").json()
    assert [c["body"] for c in listed["results"]] == ["Refunded the wrong order: A1 was asked for."]


def test_a_turn_is_rated_and_rerated_and_cleared(client, trace):
    client.force_login(user_with_role("operator", "olga"))
    url = f"/api/v1/traces/{trace.pk}/ratings"

    assert client.post(url, {"position": 1, "rating": "down"}, content_type="application/json").json()["value"] == -1
    assert client.post(url, {"position": 1, "rating": "4"}, content_type="application/json").json()["kind"] == "score"
    assert TurnRating.objects.get().value == 4
    assert (
        client.post(url, {"position": 1, "rating": "clear"}, content_type="application/json").json()["rating"] is None
    )
    assert not TurnRating.objects.exists()


@pytest.mark.parametrize(
    ("path", "body", "status", "field"),
    [
        ("comments", {"position": 1, "body": ""}, 400, "body"),
        ("comments", {"position": 9, "body": "x"}, 404, None),
        ("comments", {"position": 1, "body": "x", "quote": "not in the turn"}, 400, "quote"),
        ("ratings", {"position": 1, "rating": "7"}, 400, "rating"),
        ("ratings", {"position": 0, "rating": "up"}, 400, "position"),  # a user turn is not rated
    ],
)
def test_bad_words_or_ratings_are_named(client, trace, path, body, status, field):
    client.force_login(user_with_role("operator"))

    answer = client.post(f"/api/v1/traces/{trace.pk}/{path}", body, content_type="application/json")

    assert answer.status_code == status, answer.content
    if field:
        assert answer.json()["errors"][0]["field"] == field


def test_a_key_reads_but_never_writes(client, trace, ingest_key):
    auth = {"HTTP_AUTHORIZATION": f"Bearer {ingest_key}"}
    for path, body in (("comments", {"position": 1, "body": "x"}), ("ratings", {"position": 1, "rating": "up"})):
        answer = client.post(f"/api/v1/traces/{trace.pk}/{path}", body, content_type="application/json", **auth)
        assert answer.status_code == 403 and answer.json()["errors"][0]["field"] == "Authorization"
    other = TraceFactory(external_id="theirs")
    assert client.get(f"/api/v1/traces/{other.pk}/comments", **auth).status_code == 404
    assert not Comment.objects.exists() and not TurnRating.objects.exists()


def test_a_reviewer_comments_on_the_trace_of_the_item_it_holds_and_on_no_other(client, trace):
    from datetime import timedelta

    from django.utils import timezone

    from feedback.models import AnnotationQueue, QueueItem, QueueItemStatus

    reviewer = user_with_role("reviewer", "rita")
    queue = AnnotationQueue.objects.create(name="refunds")
    item = QueueItem.objects.create(
        queue=queue, trace=trace, position=0, locked_by=reviewer, locked_until=timezone.now() + timedelta(minutes=10)
    )
    held = TraceFactory(external_id="not-held", deployment=trace.deployment)
    MessageFactory(trace=held, position=0, role="assistant", content="Hi.")
    client.force_login(reviewer)
    body = {"position": 1, "body": "Refunded the wrong order."}

    assert client.post(f"/api/v1/traces/{trace.pk}/comments", body, content_type="application/json").status_code == 201
    answer = client.post(
        f"/api/v1/traces/{held.pk}/comments", {"position": 0, "body": "x"}, content_type="application/json"
    )
    assert answer.status_code == 403
    QueueItem.objects.filter(pk=item.pk).update(locked_until=timezone.now() - timedelta(minutes=1))
    assert client.post(f"/api/v1/traces/{trace.pk}/comments", body, content_type="application/json").status_code == 403
    QueueItem.objects.filter(pk=item.pk).update(status=QueueItemStatus.DONE, done_by=reviewer)
    assert len(client.get(f"/api/v1/traces/{trace.pk}/comments").json()["results"]) == 1  # its own, done item
    assert Comment.objects.count() == 1
