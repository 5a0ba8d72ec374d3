"""The demo agent through the real gateway (uvicorn, real openai client) in front of the
real vLLM server on the tiny model: one trace per episode served by the live version,
graded outcomes reported as grades (not customer feedback), seeded operator comments."""

from __future__ import annotations

import re

import pytest
from django.core.management import call_command

from feedback.demo.agent import demo_agent_run
from feedback.models import Comment, CustomerFeedback, Grade, Trace, TraceSource
from feedback.services.api_keys import api_key_create
from tests.factories import DeploymentFactory, user_with_role

pytestmark = [pytest.mark.vllm, pytest.mark.postgres]


@pytest.fixture
def live(transactional_db, tiny_base):
    from training.serving.models import ModelVersion
    from training.serving.services import live_version_set

    deployment = DeploymentFactory(name="support-bot")
    version = ModelVersion.objects.get(name=tiny_base.name)
    live_version_set(deployment=deployment, version=version)
    key = api_key_create(deployment=deployment, scopes=["ingest", "feedback"]).plaintext
    return deployment, version, key


def test_each_episode_is_one_trace_of_the_live_version_with_its_graded_outcome(gateway, live):
    deployment, version, key = live
    result = demo_agent_run(base_url=gateway.url, api_key=key, split="test", episodes=3, seed=5)
    gateway.drain()

    assert len(result.episodes) == 3 and result.graded == 3
    assert set(result.by_model) == {version.name}
    assert result.by_model[version.name].success_rate == result.success_rate
    for ep in result.episodes:
        trace = Trace.objects.get(deployment=deployment, external_id=ep.trace_id)
        assert (trace.source, trace.model_version_id, trace.environment) == (
            TraceSource.GATEWAY,
            version.id,
            "support-desk",
        )
        assert trace.metadata["task_id"] == ep.task_id and trace.metadata["split"] == "test"
        # The customer's visit: their order, in this run only (a later run's customers are new
        # to a progressive release, not tied to the version that served them here).
        run = ep.trace_id.split("-")[1]
        assert re.fullmatch(rf"customer-[^\s]+-{run}", trace.session_id), trace.session_id
        # The first turn is a tool call in the OpenAI format (the harness keeps the model to it).
        first = trace.messages.filter(role="assistant").order_by("position").first()
        assert first.tool_calls[0]["function"]["name"] in {"lookup_order", "issue_refund"}
        assert trace.messages.filter(role="tool").count() == ep.tool_calls
        grade = Grade.objects.get(trace=trace)
        assert (grade.outcome, grade.reason, grade.source) == (
            "success" if ep.success else "failure",
            ep.reason,
            "support-desk",
        )
        assert grade.score == ep.reward and trace.outcome == grade.outcome
        assert not trace.has_customer_feedback and not CustomerFeedback.objects.filter(trace=trace).exists()


def test_concurrent_conversations_each_keep_their_own_trace_and_come_back_in_task_order(gateway, live):
    from training.environments.support_desk import tasks_sample

    deployment, _version, key = live
    result = demo_agent_run(base_url=gateway.url, api_key=key, split="test", episodes=5, seed=7, concurrency=3)
    gateway.drain()

    tasks = tasks_sample(split="test", count=5, seed=7)
    assert [ep.task_id for ep in result.episodes] == [t.id for t in tasks]
    assert len({ep.trace_id for ep in result.episodes}) == 5
    for ep, task in zip(result.episodes, tasks, strict=True):
        trace = Trace.objects.get(deployment=deployment, external_id=ep.trace_id)
        # No turn of another conversation landed in this one's trace.
        assert trace.metadata["task_id"] == ep.task_id
        assert trace.messages.filter(role="user").order_by("position").last().content == task.prompt
        # The last tool result is never sent on when the episode ran out of steps.
        assert trace.messages.filter(role="tool").count() in {ep.tool_calls, ep.tool_calls - 1}
        assert Grade.objects.get(trace=trace).reason == ep.reason


def test_the_command_seeds_customer_words_and_operator_comments_on_tracking_tasks(gateway, live):
    deployment, _version, key = live
    user_with_role("operator", username="operator")
    call_command(
        "demo_agent", "--base-url", gateway.url, "--api-key", key, "--split", "train", "--episodes", "6", "--seed", "2"
    )
    gateway.drain()
    traces = Trace.objects.filter(deployment=deployment)
    tracking = [t for t in traces if t.metadata["task_id"].startswith("track-")]
    assert traces.count() == 6 and tracking, "seed 2 draws at least one tracking task"
    for trace in tracking:
        words = CustomerFeedback.objects.get(trace=trace)
        assert words.customer_ref == "customer" and words.rating == -1 and words.comment
        comment = Comment.objects.get(trace=trace)
        assert comment.author.username == "operator" and comment.message.role == "assistant"
    graded = [t for t in traces if t.metadata["task_id"].startswith("refund-")]
    assert all(Grade.objects.filter(trace=t).exists() for t in graded)


def test_a_wrong_key_or_a_key_without_the_feedback_scope_is_a_clear_error(gateway, live):
    from django.core.management.base import CommandError

    deployment, _version, _key = live
    with pytest.raises(CommandError, match="the gateway refused the key"):
        call_command("demo_agent", "--base-url", gateway.url, "--api-key", "prk_wrong", "--episodes", "1")
    # Seed 2's train tasks include a tracking task, whose customer words need the feedback scope.
    ingest_only = api_key_create(deployment=deployment, scopes=["ingest"]).plaintext
    with pytest.raises(CommandError, match=r"feedback refused \(403\).*the feedback scope for feedback"):
        call_command(
            "demo_agent", "--base-url", gateway.url, "--api-key", ingest_only, "--split", "train", "--episodes", "6",
            "--seed", "2",
        )  # fmt: skip
