"""Comments, ratings and corrections: what operators rely on when they annotate a turn."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import PermissionDenied

from feedback.models import Comment, Correction, Message, Trace, TurnRating
from feedback.services.review import (
    comment_add,
    comment_delete,
    comment_edit,
    comment_resolve,
    correction_add,
    turn_rating_clear,
    turn_rating_set,
)
from tests.factories import user_with_role
from webapp.kernel.chat_format import FieldError

pytestmark = pytest.mark.django_db


def msg(trace: Trace, position: int) -> Message:
    return trace.messages.get(position=position)


def test_a_comment_marks_the_trace_and_deleting_the_last_one_unmarks_it(tool_trace, operator):
    answer = msg(tool_trace, 4)
    first = comment_add(message=answer, author=operator, body="Should have given the tracking link.")
    second = comment_add(message=msg(tool_trace, 1), author=operator, body="Customer was polite.")
    assert Trace.objects.get(pk=tool_trace.pk).has_comment
    comment_delete(comment=first, user=operator)
    assert Trace.objects.get(pk=tool_trace.pk).has_comment
    comment_delete(comment=second, user=operator)
    assert not Trace.objects.get(pk=tool_trace.pk).has_comment


def test_a_quoted_span_is_checked_against_the_message_text(tool_trace, operator):
    answer = msg(tool_trace, 4)  # "It has shipped."
    c = comment_add(message=answer, author=operator, body="vague", quote_start=7, quote_end=14)
    assert (c.quote, c.quote_start, c.quote_end) == ("shipped", 7, 14)
    # Offsets a browser counted differently: the selected text wins when it occurs.
    c = comment_add(message=answer, author=operator, body="x", quote_start=0, quote_end=3, quote="shipped")
    assert (c.quote_start, c.quote_end) == (7, 14)
    with pytest.raises(FieldError) as err:
        comment_add(message=answer, author=operator, body="x", quote_start=5, quote_end=500)
    assert err.value.field == "quote_end"
    with pytest.raises(FieldError) as err:
        comment_add(message=answer, author=operator, body="x", quote="not in there")
    assert err.value.field == "quote"
    with pytest.raises(FieldError) as err:
        comment_add(message=answer, author=operator, body="   ")
    assert err.value.field == "body"


def test_only_the_author_edits_or_deletes_but_anyone_resolves(tool_trace, operator):
    other = user_with_role("operator", "oscar")
    c = comment_add(message=msg(tool_trace, 4), author=operator, body="first")
    with pytest.raises(PermissionDenied):
        comment_edit(comment=c, user=other, body="hijack")
    with pytest.raises(PermissionDenied):
        comment_delete(comment=c, user=other)
    comment_edit(comment=c, user=operator, body="better wording")
    comment_resolve(comment=c, user=other)
    c.refresh_from_db()
    assert c.body == "better wording" and c.edited_at is not None
    assert c.is_resolved and c.resolved_by == other
    assert Comment.objects.count() == 1


def test_a_person_rates_a_turn_once_and_can_change_or_clear_it(tool_trace, operator):
    answer = msg(tool_trace, 4)
    turn_rating_set(message=answer, user=operator, kind="thumbs", value="down")
    turn_rating_set(message=answer, user=operator, kind="score", value="4")
    rating = TurnRating.objects.get()
    assert (rating.kind, rating.value, rating.normalised) == ("score", 4, 0.75)
    with pytest.raises(FieldError):
        turn_rating_set(message=answer, user=operator, kind="score", value="6")
    with pytest.raises(FieldError) as err:
        turn_rating_set(message=msg(tool_trace, 1), user=operator, kind="thumbs", value="up")
    assert "assistant" in err.value.reason
    turn_rating_clear(message=answer, user=operator)
    assert not TurnRating.objects.exists()


def test_a_correction_is_stored_beside_the_original_and_its_tool_calls_are_validated(tool_trace, operator):
    call_turn = msg(tool_trace, 2)
    original = dict(call_turn.raw)
    correction = correction_add(
        message=call_turn,
        author=operator,
        content="Let me check that order and refund it.",
        tool_calls=[{"function": {"name": "refund", "arguments": '{"order_id": "A1", "amount": 12.5}'}}],
        note="The customer asked for a refund.",
    )
    call_turn.refresh_from_db()
    assert call_turn.raw == original and call_turn.tool_calls[0]["function"]["name"] == "lookup_order"
    stored = Correction.objects.get(pk=correction.pk)
    assert stored.tool_calls[0]["function"]["name"] == "refund"
    assert json.loads(stored.tool_calls[0]["function"]["arguments"]) == {"order_id": "A1", "amount": 12.5}
    assert stored.tool_calls[0]["id"].startswith("call_")
    assert stored.as_openai()["role"] == "assistant"

    cases = [
        (
            [{"function": {"name": "cancel_everything", "arguments": "{}"}}],
            "tool_calls[0].function.name",
            "unknown tool",
        ),
        (
            [{"function": {"name": "refund", "arguments": '{"order_id": "A1"}'}}],
            "tool_calls[0].function.arguments",
            "amount",
        ),
        (
            [{"function": {"name": "refund", "arguments": '{"order_id": "A1", "amount": -3}'}}],
            "tool_calls[0].function.arguments.amount",
            "minimum",
        ),
        (
            [{"function": {"name": "lookup_order", "arguments": "{not json"}}],
            "tool_calls[0].function.arguments",
            "JSON",
        ),
        ([{"function": {"name": "lookup_order", "arguments": "[1]"}}], "tool_calls[0].function.arguments", "object"),
    ]
    for calls, field, reason in cases:
        with pytest.raises(FieldError) as err:
            correction_add(message=call_turn, author=operator, tool_calls=calls)
        assert err.value.field == field
        assert reason in err.value.reason
    with pytest.raises(FieldError) as err:
        correction_add(message=call_turn, author=operator, content="  ")
    assert err.value.field == "content"
    with pytest.raises(FieldError):
        correction_add(message=msg(tool_trace, 1), author=operator, content="users are not corrected")
    assert Correction.objects.count() == 1


def test_a_correction_note_over_its_stated_limit_is_refused_not_cut(tool_trace, operator):
    from feedback.services.review import REVIEW_LIMITS

    limit = REVIEW_LIMITS["note"]
    with pytest.raises(FieldError) as err:
        correction_add(message=msg(tool_trace, 4), author=operator, content="Fixed.", note="x" * (limit + 1))
    assert err.value.field == "note" and f"at most {limit}" in err.value.reason
    kept = correction_add(message=msg(tool_trace, 4), author=operator, content="Fixed.", note="y" * limit)
    assert len(kept.note) == limit
