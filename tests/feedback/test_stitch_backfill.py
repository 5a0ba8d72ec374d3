"""`manage.py stitch_traces`: joining stored header-less gateway traces into conversations."""

from __future__ import annotations

import time
from io import StringIO

import pytest
from django.core.management import call_command

from feedback.gateway.exchange import Exchange
from feedback.models import Comment, Trace, TurnRating
from feedback.services.capture import exchanges_record, new_trace_key
from feedback.services.review import comment_add
from tests.factories import DeploymentFactory, user_with_role
from webapp.kernel.chat_format import parse_message

pytestmark = pytest.mark.django_db

SYSTEM = {"role": "system", "content": "You are Acme's support agent."}


def call(deployment, messages: list[dict], reply: dict, rid: str) -> Exchange:
    """An exchange as the gateway logged it before stitching: a new trace per call."""
    return Exchange(
        deployment_id=deployment.id,
        trace_key=new_trace_key(),
        explicit_trace=False,
        session_id="",
        requested_model="agent",
        version_id=None,
        messages=[parse_message(m, "m") for m in messages],
        tools=[],
        params={},
        metadata={},
        started_at=time.time(),
        latency_ms=10.0,
        response={
            "id": rid,
            "choices": [{"index": 0, "message": {"role": "assistant", **reply}, "finish_reason": "stop"}],
            "usage": {"total_tokens": 5},
        },
    )


def converse(deployment, first_words: str, replies: list[dict], users: list[str]) -> list[dict]:
    """Log a conversation call by call; returns the history the client ends with."""
    history = [SYSTEM, {"role": "user", "content": first_words}]
    said = iter(users)
    for i, reply in enumerate(replies):
        exchanges_record(exchanges=[call(deployment, history, reply, f"{first_words[:3]}-{i}")])
        history = [*history, {"role": "assistant", **reply}]
        if reply.get("tool_calls"):
            history.append({"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "shipped"})
        elif (words := next(said, None)) is not None:
            history.append({"role": "user", "content": words})
    return history


def lookup(order: str) -> dict:
    return {
        "content": None,
        "tool_calls": [{"id": f"call_{order}", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}],
    }


def test_stitch_traces_plans_first_then_merges_keeping_annotations_on_their_turns():
    deployment = DeploymentFactory(name="old-agent")
    operator = user_with_role("operator", "olga")
    a = converse(deployment, "Where is A1?", [lookup("A1"), {"content": "Shipped."}, {"content": "Bye!"}], ["Thanks"])
    b = converse(deployment, "Refund B1?", [{"content": "Done."}, {"content": "You're welcome."}], ["Thanks"])
    assert Trace.objects.count() == 5  # one per call, each repeating the history so far

    # An operator commented on the second call's answer in the third call's copy of it, and
    # rated the answer of the third call.
    third = Trace.objects.get(messages__response_id="Whe-2")
    repeated = third.messages.get(position=4)  # "Shipped." as the client sent it back
    comment_add(message=repeated, author=operator, body="good")
    TurnRating.objects.create(
        trace=third, message=third.messages.get(position=6), user=operator, kind="thumbs", value=1
    )

    out = StringIO()
    call_command("stitch_traces", "--deployment", "old-agent", stdout=out)
    assert "would merge 3 into 2 conversation trace(s)" in out.getvalue()
    assert Trace.objects.count() == 5  # a dry run changes nothing

    call_command("stitch_traces", "--deployment", "old-agent", "--apply", stdout=StringIO())
    traces = {t.messages.get(position=1).content: t for t in Trace.objects.all()}
    assert sorted(traces) == ["Refund B1?", "Where is A1?"]
    trace_a, trace_b = traces["Where is A1?"], traces["Refund B1?"]
    rows = [(m.role, m.content, m.response_id) for m in trace_a.messages.order_by("position")]
    assert [(role, content) for role, content, _ in rows] == [(m["role"], m.get("content") or "") for m in a]
    assert [rid for role, _, rid in rows if role == "assistant"] == ["Whe-0", "Whe-1", "Whe-2"]  # serving data kept
    assert [m.content for m in trace_b.messages.order_by("position")] == [m["content"] for m in b]
    assert (trace_a.message_count, trace_a.assistant_turn_count, trace_a.has_comment) == (7, 3, True)
    comment = Comment.objects.get()
    assert (comment.trace_id, comment.message.position, comment.message.response_id) == (trace_a.id, 4, "Whe-1")
    rating = TurnRating.objects.get()
    assert (rating.trace_id, rating.message.response_id) == (trace_a.id, "Whe-2")

    out = StringIO()
    call_command("stitch_traces", "--deployment", "old-agent", stdout=out)
    assert "would merge 0 into 2" in out.getvalue()  # done once, nothing left


def test_stitch_traces_links_an_edited_history_as_a_fork_and_never_touches_named_traces():
    deployment = DeploymentFactory(name="old-agent")
    history = converse(deployment, "Hi", [{"content": "Hello"}, {"content": "Sure."}], ["Can you help?"])
    edited = [*history[:3], {"role": "user", "content": "Something else"}]
    exchanges_record(exchanges=[call(deployment, edited, {"content": "Ok."}, "edit")])
    named = call(deployment, [*history[:3], {"role": "user", "content": "x"}], {"content": "y"}, "named")
    named.trace_key, named.explicit_trace = "client-named", True
    exchanges_record(exchanges=[named])
    call_command("stitch_traces", "--deployment", "old-agent", "--apply", stdout=StringIO())
    fork = Trace.objects.get(messages__response_id="edit")
    root = Trace.objects.get(messages__response_id="Hi-1")
    assert (fork.forked_from_id, fork.forked_at) == (root.id, 3)
    assert Trace.objects.get(external_id="client-named").forked_from_id is None
    assert Trace.objects.count() == 3


def test_stitch_traces_never_joins_the_calls_of_two_sessions_that_opened_alike():
    deployment = DeploymentFactory(name="old-agent")
    opening = [SYSTEM, {"role": "user", "content": "Hi"}]
    first = {s: call(deployment, opening, {"content": "Hello"}, f"{s}-0") for s in ("cust-A", "cust-B")}
    for session, exchange in first.items():  # the same words and the same answer, A first
        exchange.session_id = session
        exchanges_record(exchanges=[exchange])
    for session in ("cust-A", "cust-B"):  # then each customer says something of their own
        said = [*opening, {"role": "assistant", "content": "Hello"}, {"role": "user", "content": f"I am {session}."}]
        exchange = call(deployment, said, {"content": "Noted."}, f"{session}-1")
        exchange.session_id = session
        exchanges_record(exchanges=[exchange])

    call_command("stitch_traces", "--deployment", "old-agent", "--apply", stdout=StringIO())
    traces = Trace.objects.all()
    assert len(traces) == 2
    for trace in traces:
        said = [m.content for m in trace.messages.order_by("position")]
        assert said == [SYSTEM["content"], "Hi", "Hello", f"I am {trace.session_id}.", "Noted."]


def test_stitch_traces_never_merges_a_client_named_trace_shaped_like_a_gateway_id():
    deployment = DeploymentFactory(name="old-agent")
    history = converse(deployment, "Hi", [{"content": "Hello"}], [])
    # A client that names its traces `gw-<32 hex>` itself, continuing the same conversation.
    named = call(deployment, [*history, {"role": "user", "content": "More?"}], {"content": "Yes."}, "named")
    named.trace_key, named.explicit_trace = "gw-" + "ab" * 16, True
    exchanges_record(exchanges=[named])
    assert Trace.objects.count() == 2

    out = StringIO()
    call_command("stitch_traces", "--deployment", "old-agent", "--apply", stdout=out)
    client_named = Trace.objects.get(external_id="gw-" + "ab" * 16)
    assert [m.content for m in client_named.messages.order_by("position")] == [
        "You are Acme's support agent.",
        "Hi",
        "Hello",
        "More?",
        "Yes.",
    ]
    assert Trace.objects.count() == 2


def test_stitch_traces_still_joins_gateway_traces_stored_before_they_were_marked():
    deployment = DeploymentFactory(name="old-agent")
    converse(deployment, "Hi", [{"content": "Hello"}, {"content": "Sure."}], ["Can you help?"])
    for trace in Trace.objects.all():  # as stored before the gateway marked the traces it names
        trace.raw.pop("named_by_gateway", None)
        trace.save(update_fields=["raw"])
    call_command("stitch_traces", "--deployment", "old-agent", "--apply", stdout=StringIO())
    assert Trace.objects.count() == 1


def test_stitching_carries_training_items_over_to_the_conversation_and_its_turn():
    from training.models import TrainingItem, TrainingSet

    deployment = DeploymentFactory(name="old-agent")
    converse(deployment, "Where is A1?", [lookup("A1"), {"content": "Shipped."}, {"content": "Bye!"}], ["Thanks"])
    third = Trace.objects.get(messages__response_id="Whe-2")
    training_set = TrainingSet.objects.create(name="from-traces")
    on_repeated = TrainingItem.objects.create(
        training_set=training_set, key="repeated", messages=[], trace=third, message=third.messages.get(position=4)
    )
    on_own = TrainingItem.objects.create(
        training_set=training_set, key="own", messages=[], trace=third, message=third.messages.get(position=6)
    )

    call_command("stitch_traces", "--deployment", "old-agent", "--apply", stdout=StringIO())

    conversation = Trace.objects.get()
    on_repeated.refresh_from_db()
    on_own.refresh_from_db()
    assert (on_repeated.trace_id, on_repeated.message.trace_id) == (conversation.id, conversation.id)
    assert (on_repeated.message.position, on_repeated.message.response_id) == (4, "Whe-1")
    assert (on_own.trace_id, on_own.message.response_id) == (conversation.id, "Whe-2")


def test_stitching_keeps_the_later_calls_grades_as_the_conversations_outcome():
    from feedback.models import Grade
    from feedback.services.grades import GradeIn, grades_write

    deployment = DeploymentFactory(name="old-agent")
    converse(deployment, "Where is A1?", [lookup("A1"), {"content": "Shipped."}], [])
    first, second = Trace.objects.order_by("id")

    def grade(trace, name, outcome, reason):
        grades_write(deployment_id=deployment.id, grades=[(trace.id, GradeIn(name, outcome, None, reason, "checker"))])

    grade(first, "outcome", "failure", "no answer yet")
    grade(first, "tone", "success", "polite")
    grade(second, "outcome", "success", "answered with the tracking status")
    call_command("stitch_traces", "--deployment", "old-agent", "--apply", stdout=StringIO())
    (trace,) = Trace.objects.all()
    assert sorted(Grade.objects.filter(trace=trace).values_list("name", "reason")) == [
        ("outcome", "answered with the tracking status"),
        ("tone", "polite"),
    ]
    assert (trace.outcome, trace.outcome_reason) == ("success", "answered with the tracking status")
