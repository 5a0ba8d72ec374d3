"""POST /api/v1/feedback and feedback links: what a customer-facing integration relies on."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core import signing
from django.utils import timezone

from feedback.models import CustomerFeedback, Trace
from feedback.services.customer_feedback import FeedbackTarget, feedback_link_create
from tests.factories import DeploymentFactory, user_with_role

pytestmark = pytest.mark.django_db
URL = "/api/v1/feedback"


def post(client, key, body, url=URL):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json", **headers)


@pytest.fixture
def feedback_key(deployment, make_key):
    return make_key(deployment, ["feedback"])


def test_feedback_by_trace_id_is_stored_and_marks_the_trace(client, tool_trace, feedback_key):
    response = post(
        client,
        feedback_key,
        {"trace_id": tool_trace.id, "rating": "down", "comment": "Wrong order!", "customer_ref": "cust-9"},
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["trace_id"] == tool_trace.id and body["rating"] == {"kind": "thumbs", "value": -1}
    assert body["message_position"] is None
    stored = CustomerFeedback.objects.get()
    assert (stored.comment, stored.customer_ref, stored.api_key.deployment_id) == (
        "Wrong order!",
        "cust-9",
        tool_trace.deployment_id,
    )
    trace = Trace.objects.get(pk=tool_trace.pk)
    assert trace.has_customer_feedback and trace.feedback_rating == -1
    # A later, happier score does not hide the unhappy one from the "negative" filter.
    assert post(client, feedback_key, {"external_id": "conv-1", "rating": 5}).status_code == 201
    assert Trace.objects.get(pk=tool_trace.pk).feedback_rating == -1


def test_feedback_by_response_id_lands_on_that_assistant_turn(client, tool_trace, feedback_key):
    response = post(
        client, feedback_key, {"response_id": "chatcmpl-42", "rating": 4, "correction": "Give the tracking link."}
    )
    assert response.status_code == 201
    assert response.json()["message_position"] == 4
    stored = CustomerFeedback.objects.get()
    assert stored.message == tool_trace.messages.get(position=4)
    assert (stored.rating_kind, stored.rating, stored.rating_normalised) == ("score", 4, 0.75)


def test_an_idempotency_key_makes_retries_safe_and_refuses_a_different_body(client, tool_trace, feedback_key):
    body = {"trace_id": tool_trace.id, "rating": "up", "idempotency_key": "fb-1"}
    first = post(client, feedback_key, body)
    again = post(client, feedback_key, body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    conflict = post(client, feedback_key, {**body, "rating": "down"})
    assert conflict.status_code == 409 and conflict.json()["errors"][0]["field"] == "idempotency_key"
    assert CustomerFeedback.objects.count() == 1


def test_unknown_ids_get_404_with_the_reason(client, tool_trace, feedback_key):
    for body, field in (
        ({"trace_id": 999999, "rating": "up"}, "trace_id"),
        ({"response_id": "chatcmpl-nope", "rating": "up"}, "response_id"),
        ({"external_id": "nope", "rating": "up"}, "external_id"),
    ):
        response = post(client, feedback_key, body)
        assert response.status_code == 404
        assert response.json()["errors"][0]["field"] == field and "no " in response.json()["errors"][0]["reason"]
    assert not CustomerFeedback.objects.exists()


def test_a_key_of_another_deployment_cannot_touch_this_trace(client, tool_trace, make_key):
    other_key = make_key(DeploymentFactory(name="other-bot"), ["feedback"])
    assert post(client, other_key, {"trace_id": tool_trace.id, "rating": "down"}).status_code == 404
    assert post(client, other_key, {"response_id": "chatcmpl-42", "rating": "down"}).status_code == 404
    link = post(client, other_key, {"trace_id": tool_trace.id}, url="/api/v1/feedback/links")
    assert link.status_code == 404
    assert not CustomerFeedback.objects.exists()
    assert not Trace.objects.get(pk=tool_trace.pk).has_customer_feedback


def test_scopes_are_enforced_both_ways(client, tool_trace, deployment, make_key, feedback_key):
    ingest_only = make_key(deployment, ["ingest"])
    response = post(client, ingest_only, {"trace_id": tool_trace.id, "rating": "up"})
    assert response.status_code == 403 and "feedback" in response.json()["detail"]
    # A feedback key cannot read traces.
    read = client.get(f"/api/v1/traces/{tool_trace.id}", HTTP_AUTHORIZATION=f"Bearer {feedback_key}")
    assert read.status_code == 403
    assert post(client, None, {"trace_id": tool_trace.id, "rating": "up"}).status_code == 401


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"rating": "meh"}, "rating"),
        ({"rating": 6}, "rating"),
        ({"rating": True}, "rating"),
        ({}, "rating"),
        ({"comment": 5}, "comment"),
        ({"comment": "x" * 20_001}, "comment"),
        ({"rating": "up", "trace_id": "abc"}, "trace_id"),
        # str.isdigit() takes these, int() does not / PostgreSQL's bigint cannot hold it
        ({"rating": "\u00b2"}, "rating"),
        ({"rating": "up", "trace_id": "\u00b2"}, "trace_id"),
        ({"rating": "up", "trace_id": "9" * 30}, "trace_id"),
        ({"rating": "up", "trace_id": 10**30}, "trace_id"),
        ({"rating": "up", "trace_id": 1, "response_id": "x"}, "trace_id"),
        ({"comment": "nul \u0000 byte"}, "comment"),
        ({"rating": "up", "response_id": "a\u0000b"}, "response_id"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(client, tool_trace, feedback_key, body, field):
    body = {"trace_id": tool_trace.id, **body} if "trace_id" not in body and "response_id" not in body else body
    response = post(client, feedback_key, body)
    assert response.status_code == 400
    assert response.json()["errors"][0]["field"] == field
    assert not CustomerFeedback.objects.exists()


def test_a_body_that_is_not_an_object_is_a_400(client, feedback_key):
    assert post(client, feedback_key, "{nope").status_code == 400
    assert post(client, feedback_key, "[1]").json()["errors"][0]["field"] == "body"


def test_a_feedback_link_lets_a_browser_post_without_a_key(client, tool_trace, feedback_key):
    made = post(
        client,
        feedback_key,
        {"response_id": "chatcmpl-42", "customer_ref": "cust-7", "expires_in": 600},
        url="/api/v1/feedback/links",
    )
    assert made.status_code == 201
    link = made.json()
    assert link["url"].startswith("http://testserver/f/")
    page = client.get(link["url"])
    assert page.status_code == 200 and "How did we do?" in page.content.decode()
    sent = client.post(link["url"], {"rating": "down", "comment": "Did not help <script>x</script>"})
    assert sent.status_code == 200 and "Thank you" in sent.content.decode()
    fb = CustomerFeedback.objects.get()
    assert (fb.source, fb.customer_ref, fb.rating, fb.api_key) == ("link", "cust-7", -1, None)
    assert fb.message.position == 4
    # Another link, through the JSON endpoint for a customer's own widget.
    other = post(client, feedback_key, {"trace_id": tool_trace.id}, url="/api/v1/feedback/links").json()
    api = post(client, None, {"rating": 5, "comment": "later: fine", "trace_id": 12345}, url=other["api_url"])
    assert api.status_code == 201 and api.json()["trace_id"] == tool_trace.id
    assert CustomerFeedback.objects.count() == 2


def test_a_feedback_link_takes_one_answer_and_a_replay_is_refused_saying_so(client, tool_trace, feedback_key):
    link = post(client, feedback_key, {"trace_id": tool_trace.id}, url="/api/v1/feedback/links").json()
    sent = client.post(link["url"], {"rating": "down", "comment": "Did not help"})
    assert sent.status_code == 200 and "Thank you" in sent.content.decode()
    # The form again, a second post through it, and the JSON endpoint: all refused.
    for replay in (
        client.get(link["url"]),
        client.post(link["url"], {"rating": "up", "comment": "all good actually"}),
    ):
        assert replay.status_code == 409 and "already been used" in replay.content.decode()
    api = post(client, None, {"rating": 5}, url=link["api_url"])
    assert api.status_code == 409 and api.json()["errors"][0]["field"] == "token"
    assert "already been used" in api.json()["detail"]
    assert CustomerFeedback.objects.count() == 1

    # The widget's retry of its own answer (same idempotency_key) gets that answer back.
    widget = post(client, feedback_key, {"trace_id": tool_trace.id}, url="/api/v1/feedback/links").json()
    first = post(client, None, {"rating": 4, "idempotency_key": "w-1"}, url=widget["api_url"])
    retry = post(client, None, {"rating": 4, "idempotency_key": "w-1"}, url=widget["api_url"])
    assert (first.status_code, retry.status_code) == (201, 200) and first.json()["id"] == retry.json()["id"]
    assert post(client, None, {"rating": 1, "idempotency_key": "w-2"}, url=widget["api_url"]).status_code == 409


def test_expired_and_tampered_links_are_refused(client, tool_trace):
    target = FeedbackTarget(tool_trace, None)
    expired, _ = feedback_link_create(
        target=target, expires_in=timedelta(hours=1), now=timezone.now() - timedelta(hours=2)
    )
    good, _ = feedback_link_create(target=target)
    payload = signing.loads(good, salt="practicum.feedback-link")
    forged = signing.dumps({**payload, "t": payload["t"] + 1}, salt="wrong-salt", compress=True)
    tampered = good[:-2] + ("AA" if not good.endswith("AA") else "BB")
    for token, reason in ((expired, "expired"), (tampered, "not valid"), (forged, "not valid")):
        page = client.get(f"/f/{token}")
        assert page.status_code == 403 and reason in page.content.decode()
        assert client.post(f"/f/{token}", {"rating": "up"}).status_code == 403
        api = post(client, None, {"rating": "up"}, url=f"/api/v1/feedback/links/{token}")
        assert api.status_code == 403 and reason in api.json()["detail"]
    assert not CustomerFeedback.objects.exists()
    assert client.post(f"/f/{good}", {"rating": "up"}).status_code == 200


def test_links_never_outlive_the_maximum(client, tool_trace, feedback_key, settings):
    settings.FEEDBACK_LINK_MAX_AGE = 3600
    response = post(client, feedback_key, {"trace_id": tool_trace.id, "expires_in": 7200}, url="/api/v1/feedback/links")
    assert response.status_code == 400 and response.json()["errors"][0]["field"] == "expires_in"


def test_logged_in_people_read_traces_through_the_api_by_role(client, tool_trace, reviewer):
    client.force_login(user_with_role("operator", "omar"))
    assert client.get(f"/api/v1/traces/{tool_trace.id}").status_code == 200
    client.force_login(reviewer)
    assert client.get(f"/api/v1/traces/{tool_trace.id}").status_code == 403
