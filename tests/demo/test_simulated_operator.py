"""The simulated operator reviews stored traces through the comment service: a comment in
words on the turn that went wrong, under an account marked as simulated, read by feedback
training sets as an operator's comment is."""

from __future__ import annotations

import json

import pytest

from feedback.demo.operator import SIMULATED_OPERATOR, simulated_operator_review
from feedback.models import Comment, Trace
from feedback.services.ingest import traces_ingest
from tests.factories import DeploymentFactory
from training.environments.support_desk import SupportDesk
from training.services.feedback_sets import training_set_from_feedback

pytestmark = pytest.mark.django_db


def _call(n: int, name: str, order_id: str) -> dict:
    arguments = json.dumps({"order_id": order_id})
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def _trace(external_id: str, task, reply: str) -> dict:
    """A logged episode: the lookup, what the store answered, then `reply` to the customer."""
    env = SupportDesk()
    order_id = task.hidden["order_id"]
    row = env.call(env.reset(task), "lookup_order", {"order_id": order_id})
    messages = [
        {"role": "system", "content": task.system},
        {"role": "user", "content": task.prompt},
        _call(0, "lookup_order", order_id),
        {"role": "tool", "tool_call_id": "call_0", "content": row},
        {"role": "assistant", "content": reply},
    ]
    return {
        "external_id": external_id,
        "environment": "support-desk",
        "messages": messages,
        "metadata": {"environment": "support-desk", "task_id": task.id, "split": task.split},
    }


def test_the_lead_comments_in_words_on_the_refusal_only_once_and_a_feedback_set_reads_it():
    deployment = DeploymentFactory(name="support-bot")
    due = next(t for t in SupportDesk().tasks_for(split="train", graded=True) if t.hidden["refund"])
    results = traces_ingest(
        deployment=deployment,
        items=[
            _trace("refused", due, "I am sorry, this order cannot be refunded."),
            # A tracking task has no grade, so no policy turn to get wrong.
            _trace("tracking", SupportDesk().tasks_for(split="train", graded=False)[0], "It is on its way to you."),
        ],
    )
    assert all(r.status != "error" for r in results), results

    counts = simulated_operator_review(
        traces=Trace.objects.filter(deployment=deployment), seed=0, vague_rate=0, wrong_rate=0
    )

    assert counts == {"specific": 1}
    comment = Comment.objects.get()
    assert comment.trace.external_id == "refused" and comment.message.position == 4
    assert comment.author.username == SIMULATED_OPERATOR and not comment.author.is_active
    assert "simulated" in comment.author.get_full_name().lower()
    days = json.loads(
        SupportDesk().call(SupportDesk().reset(due), "lookup_order", {"order_id": due.hidden["order_id"]})
    )
    assert f"{days['delivered_days_ago']} days" in comment.body and "30" in comment.body
    assert "issue_refund" not in comment.body and "<tool_call>" not in comment.body

    assert simulated_operator_review(traces=Trace.objects.filter(deployment=deployment), seed=0) == {}
    assert Comment.objects.count() == 1

    built = training_set_from_feedback(name="desk-comments", filters={"deployment": deployment.pk}, heldout_fraction=0)
    (item,) = built.items.all()
    assert item.feedback == comment.body and item.provenance["comments"] == [comment.pk]
    assert item.provenance["comment_authors"] == [SIMULATED_OPERATOR]
    assert item.messages[-1]["role"] == "tool"


def test_the_command_reviews_one_deployments_split_and_refuses_bad_rates():
    from io import StringIO

    from django.core.management import CommandError, call_command

    deployment = DeploymentFactory(name="support-bot")
    desk = SupportDesk()
    due = [t for t in desk.tasks_for(split="train", graded=True) if t.hidden["refund"]][:3]
    held_out = next(t for t in desk.tasks_for(split="test", graded=True) if t.hidden["refund"])
    traces_ingest(
        deployment=deployment,
        items=[_trace(f"t{n}", t, "Sorry, no refund for this order.") for n, t in enumerate([*due, held_out])],
    )
    out = StringIO()
    call_command(
        "simulate_operator", "--deployment", "support-bot", "--vague-rate", "0", "--wrong-rate", "0", stdout=out
    )

    assert out.getvalue().startswith(
        "3 comments as simulated-operator (3 specific, 0 vague, 0 wrong); 1 held-out traces left alone"
    )
    assert not Comment.objects.filter(trace__external_id="t3").exists(), "the test split is never reviewed"
    with pytest.raises(CommandError, match="--wrong-rate must be between 0 and 1"):
        call_command("simulate_operator", "--wrong-rate", "1.5")


def test_unreadable_metadata_is_skipped_and_a_hand_made_account_is_locked():
    from django.contrib.auth import get_user_model

    get_user_model().objects.create_user(username=SIMULATED_OPERATOR, password="guessable-password-1")
    deployment = DeploymentFactory(name="support-bot")
    due = next(t for t in SupportDesk().tasks_for(split="train", graded=True) if t.hidden["refund"])
    bad = _trace("bad", due, "No refund.")
    bad["metadata"]["task_id"] = ["not", "a", "string"]
    traces_ingest(deployment=deployment, items=[bad, _trace("good", due, "No refund.")])

    counts = simulated_operator_review(traces=Trace.objects.filter(deployment=deployment), vague_rate=0, wrong_rate=0)

    assert counts == {"skipped": 1, "specific": 1}
    assert Comment.objects.get().trace.external_id == "good"
    account = get_user_model().objects.get(username=SIMULATED_OPERATOR)
    assert not account.is_active and not account.has_usable_password()
