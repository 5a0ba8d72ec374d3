"""Training sets built from comments, corrections, customer feedback and judgements."""

from __future__ import annotations

import pytest

from feedback.models import (
    AnnotationQueue,
    Comment,
    Correction,
    CustomerFeedback,
    JudgeResult,
    QueueItem,
)
from feedback.models.judge import JudgeStatus, JudgeTrigger
from tests.factories import MessageFactory, TraceFactory, user_with_role
from training.models import CorrectionSource
from training.services.feedback_sets import training_set_from_feedback
from training.services.training_sets import TrainingSetError

pytestmark = pytest.mark.django_db


def conversation():
    trace = TraceFactory(external_id="conv-1", tools=[{"type": "function", "function": {"name": "lookup"}}])
    texts = [("user", "Where is A1?"), ("assistant", "No idea."), ("user", "Please check."), ("assistant", "Shipped.")]
    msgs = [MessageFactory(trace=trace, position=i, role=r, content=t) for i, (r, t) in enumerate(texts)]
    return trace, msgs


def test_each_turn_with_feedback_becomes_an_item_with_its_context_and_provenance():
    trace, m = conversation()
    comment = Comment.objects.create(trace=trace, message=m[1], body="Look the order up before answering.")
    JudgeResult.objects.create(
        trace=trace,
        message=m[1],
        trigger=JudgeTrigger.COMMENT,
        status=JudgeStatus.SUCCEEDED,
        rubric={"criteria": [{"name": "uses the tool"}]},
        reward=0.1,
        corrected_response="Let me look that up.",
        is_latest=True,
    )
    human = Correction.objects.create(trace=trace, message=m[3], content="It shipped on Monday.")
    CustomerFeedback.objects.create(
        deployment=trace.deployment, trace=trace, message=m[3], comment="too short", correction="Shipped Monday."
    )

    with pytest.raises(TrainingSetError, match="training gate is closed"):  # the judge's output is in it
        training_set_from_feedback(name="support", filters={"deployment": trace.deployment_id})
    olga = user_with_role("operator", "olga")
    built = training_set_from_feedback(
        name="support", filters={"deployment": trace.deployment_id}, user=olga, judge_gate_override_reason="pilot"
    )
    first, second = built.items.order_by("key")
    assert first.key == f"turn:{trace.deployment_id}:conv-1:1"
    assert first.messages == [{"role": "user", "content": "Where is A1?"}]
    assert first.rubric == {"criteria": [{"name": "uses the tool"}]} and first.reward == 0.1
    assert first.corrected_response == "Let me look that up." and first.correction_source == CorrectionSource.JUDGE
    assert first.feedback == comment.body and first.provenance["comments"] == [comment.pk]
    assert first.logged_response == {"role": "assistant", "content": "No idea."}
    assert first.tools == trace.tools
    # A person's correction wins over the customer's; both critiques are kept.
    assert [x["content"] for x in second.messages] == ["Where is A1?", "No idea.", "Please check."]
    assert second.corrected_response == human.content and second.correction_source == CorrectionSource.HUMAN
    assert second.feedback == "too short" and second.reward is None

    again = training_set_from_feedback(
        name="support", filters={"deployment": trace.deployment_id}, user=olga, judge_gate_override_reason="pilot"
    )
    assert again.version == 2
    assert dict(again.items.values_list("key", "split")) == dict(built.items.values_list("key", "split"))


def test_from_a_queue_and_nothing_to_build():
    trace, m = conversation()
    Comment.objects.create(trace=trace, message=m[3], body="Say when it shipped.")
    queue = AnnotationQueue.objects.create(name="q")
    QueueItem.objects.create(queue=queue, trace=trace, position=0)
    built = training_set_from_feedback(name="from-queue", queue_id=queue.pk)
    assert built.item_count == 1 and built.selection["queue"] == queue.pk

    empty = AnnotationQueue.objects.create(name="empty")
    with pytest.raises(TrainingSetError):
        training_set_from_feedback(name="nothing", queue_id=empty.pk)
    with pytest.raises(TrainingSetError):
        training_set_from_feedback(name="both", queue_id=queue.pk, filters={})


def test_the_build_form_uses_the_trace_list_filters(client):
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.urls import reverse

    from training.models import TrainingSet

    operator = get_user_model().objects.create(username="op")
    operator.groups.add(Group.objects.get(name="operator"))
    client.force_login(operator)
    trace, m = conversation()
    Comment.objects.create(trace=trace, message=m[1], body="Look it up first.")
    trace.has_comment = True  # kept by the review services; set by hand here
    trace.save(update_fields=["has_comment"])
    url = reverse("training:set-build")
    bad = client.post(url, {"name": "x y", "filters": "comment=maybe", "heldout_fraction": "2"})
    body = bad.content.decode()
    assert bad.status_code == 400 and "Held-out fraction</a>: must be a number" in body
    assert "Trace-list filters</a>: comment:" in body and "Name</a>: use letters" in body
    assert "heldout_fraction</a>" not in body and 'value="x y"' in body and 'value="comment=maybe"' in body
    ok = client.post(url, {"name": "fixes", "filters": "/traces/?comment=yes", "heldout_fraction": "0.5"})
    built = TrainingSet.objects.get(name="fixes")
    assert ok.status_code == 302 and built.item_count == 1 and built.selection["filters"] == {"comment": "yes"}
    page = client.get(reverse("training:job-list")).content.decode()
    assert "fixes v1" in page


def test_an_operators_corrected_tool_call_is_the_items_target_as_the_model_writes_it():
    """A correction that is a tool call with no words is what the turn should have been: it
    trains as the model writes a call (and exports as `tool_calls`), it is not dropped."""
    trace, m = conversation()
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"order_id": "A1"}'}}
    Correction.objects.create(trace=trace, message=m[1], content="", tool_calls=[call])
    Correction.objects.create(trace=trace, message=m[3], content="Let me check.", tool_calls=[call])

    built = training_set_from_feedback(name="calls", filters={"deployment": trace.deployment_id})

    first, second = built.items.order_by("key")
    served = '<tool_call>{"name": "lookup", "arguments": {"order_id": "A1"}}</tool_call>'
    assert (first.corrected_response, first.correction_source) == (served, CorrectionSource.HUMAN)
    assert second.corrected_response == "Let me check." + served


def test_a_v1_judges_bracket_call_is_no_target_but_its_comment_stays():
    """judge-turn/v1 showed calls as "[calls tool … with …]"; a correction written that way
    is no turn an agent can make, so it trains nothing, while the comment still does."""
    trace, m = conversation()
    Comment.objects.create(trace=trace, message=m[1], body="Look A1 up first.")
    JudgeResult.objects.create(
        trace=trace,
        message=m[1],
        trigger=JudgeTrigger.COMMENT,
        status=JudgeStatus.SUCCEEDED,
        rubric={"criteria": [{"name": "uses the tool"}]},
        reward=0.1,
        corrected_response='[calls tool lookup with {"order_id": "A1"}]',
        prompt_version="judge-turn/v1",
        is_latest=True,
    )
    olga = user_with_role("operator", "olga")

    built = training_set_from_feedback(
        name="v1", filters={"deployment": trace.deployment_id}, user=olga, judge_gate_override_reason="pilot"
    )

    (item,) = built.items.all()
    assert (item.corrected_response, item.correction_source) == ("", CorrectionSource.NONE)
    assert item.feedback == "Look A1 up first."
