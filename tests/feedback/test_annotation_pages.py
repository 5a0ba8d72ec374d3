"""Annotating through the pages, with and without htmx."""

from __future__ import annotations

import pytest

from feedback.models import Comment, Correction, Trace, TurnRating
from tests.factories import user_with_role

pytestmark = pytest.mark.django_db


def test_comment_through_htmx_returns_the_thread_and_a_plain_post_redirects(operator_client, tool_trace):
    url = f"/traces/{tool_trace.id}/messages/4/comments"
    response = operator_client.post(
        url,
        {"body": "Give the <b>tracking</b> link", "quote": "shipped", "quote_start": "7", "quote_end": "14"},
        HTTP_HX_REQUEST="true",
    )
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div class="comments" id="comments-4">')
    assert "Give the &lt;b&gt;tracking&lt;/b&gt; link" in body and "shipped" in body
    plain = operator_client.post(url, {"body": "again", "next": f"/traces/{tool_trace.id}/"})
    assert plain.status_code == 302 and plain.url == f"/traces/{tool_trace.id}/"
    assert Comment.objects.count() == 2 and Trace.objects.get(pk=tool_trace.pk).has_comment
    # Open redirects are not followed.
    evil = operator_client.post(url, {"body": "x", "next": "https://evil.example/"})
    assert evil.url == f"/traces/{tool_trace.id}/#msg-4"
    bad = operator_client.post(url, {"body": "x", "quote_start": "3", "quote_end": "999"}, HTTP_HX_REQUEST="true")
    assert bad.status_code == 400 and "quote_end" in bad.content.decode()
    assert operator_client.post(url, {"body": "nul \x00"}, HTTP_HX_REQUEST="true").status_code == 400


def test_edit_and_delete_are_for_the_author_only(client, operator_client, tool_trace, operator):
    operator_client.post(f"/traces/{tool_trace.id}/messages/4/comments", {"body": "mine"})
    comment = Comment.objects.get()
    client.force_login(user_with_role("operator", "otto"))
    assert client.post(f"/comments/{comment.id}/edit", {"body": "not yours"}).status_code == 403
    assert client.post(f"/comments/{comment.id}/delete").status_code == 403
    assert client.post(f"/comments/{comment.id}/resolve", {"resolved": "1"}).status_code == 302
    client.force_login(operator)
    assert client.post(f"/comments/{comment.id}/edit", {"body": "edited"}).status_code == 302
    comment.refresh_from_db()
    assert comment.body == "edited" and comment.is_resolved
    client.post(f"/comments/{comment.id}/delete")
    assert not Comment.objects.exists() and not Trace.objects.get(pk=tool_trace.pk).has_comment


def test_rating_widget(operator_client, tool_trace):
    url = f"/traces/{tool_trace.id}/messages/4/rating"
    response = operator_client.post(url, {"rating": "down"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and 'class="thumb active"' in response.content.decode()
    operator_client.post(url, {"rating": "3"}, HTTP_HX_REQUEST="true")
    assert TurnRating.objects.get().value == 3
    assert operator_client.post(url, {"rating": "9"}, HTTP_HX_REQUEST="true").status_code == 400
    assert operator_client.post(f"/traces/{tool_trace.id}/messages/1/rating", {"rating": "up"}).status_code == 400
    operator_client.post(url, {"rating": "clear"})
    assert not TurnRating.objects.exists()


def test_correction_editor_shows_errors_in_place_and_saves_beside_the_original(operator_client, tool_trace):
    url = f"/traces/{tool_trace.id}/messages/2/correction"
    page = operator_client.get(url)
    assert page.status_code == 200 and "lookup_order" in page.content.decode()
    bad = operator_client.post(
        url, {"content": "", "tool_id": ["call_1"], "tool_name": ["refund"], "tool_args": ['{"order_id": "A1"}']}
    )
    assert bad.status_code == 400
    assert "tool_calls[0].function.arguments: &#x27;amount&#x27; is a required property" in bad.content.decode()
    assert "tool-row has-error" in bad.content.decode()
    good = operator_client.post(
        url,
        {
            "content": "Refunding now.",
            "tool_id": ["call_1", ""],
            "tool_name": ["refund", ""],
            "tool_args": ['{"order_id": "A1", "amount": 10}', ""],
            "note": "asked for a refund",
        },
    )
    assert good.status_code == 302
    correction = Correction.objects.get()
    assert correction.tool_calls[0]["id"] == "call_1" and correction.content == "Refunding now."
    assert tool_trace.messages.get(position=2).tool_calls[0]["function"]["name"] == "lookup_order"
    detail = operator_client.get(f"/traces/{tool_trace.id}/").content.decode()
    assert "Correction by <b>olga</b>" in detail and "Refunding now." in detail
    assert operator_client.get(f"/traces/{tool_trace.id}/messages/1/correction").status_code == 404
    nul = operator_client.post(url, {"content": "a\x00b", "tool_name": [""], "tool_args": [""]})
    assert nul.status_code == 400 and "NUL" in nul.content.decode()
    assert Correction.objects.count() == 1


def test_an_htmx_request_without_a_session_redirects_the_whole_page_to_login(client, tool_trace):
    response = client.post(f"/traces/{tool_trace.id}/messages/4/comments", {"body": "x"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200 and response["HX-Redirect"].startswith("/login/?next=")
    assert not Comment.objects.exists()
    assert client.get("/traces/").status_code == 302
