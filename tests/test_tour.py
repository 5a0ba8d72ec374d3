"""The guided tour: each step is ticked from what the database holds, in order, and the
"run the agent again" button queues a run for operators only, refusing bad input with 400."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse
from django.utils import timezone

from feedback.models import Grade, GradeOutcome, JudgeResult, JudgeStatus
from feedback.services.review import comment_add
from tests.factories import DeploymentFactory, MessageFactory, TraceFactory, user_with_role
from tests.promotion.conftest import evaluation_row, make_adapter_folder
from training.models import TrainingJob
from training.promotion.models import PromotionRequest, PromotionStatus
from training.services.feedback_sets import training_set_from_feedback
from training.services.training_sets import training_set_create
from training.serving.services import base_model_register, live_version_set, model_version_create
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db


def done_steps(html: str) -> list[str]:
    return re.findall(r'id="step-([a-z_]+)" class="tour-step done', html)


@pytest.fixture
def operator():
    return user_with_role("operator", "olga")


@pytest.fixture
def tour_page(client, operator):
    client.force_login(operator)

    def get(**params):
        response = client.get(reverse("tour"), params)
        assert response.status_code == 200
        return response.content.decode()

    return get


def test_without_a_deployment_the_tour_says_how_to_start(tour_page):
    html = tour_page()
    assert "No deployment yet" in html and "make demo" in html


def test_the_steps_tick_as_the_loop_goes_round(tour_page, operator, tmp_path):
    deployment = DeploymentFactory(name="support-bot")
    DeploymentFactory(name="another")
    assert done_steps(tour_page()) == []
    assert 'href="#step-traces"' in tour_page()  # the next step is pointed at

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    base, base_version = base_model_register(name="smol", path=tmp_path / "base")
    live_version_set(deployment=deployment, version=base_version)
    trace = TraceFactory(deployment=deployment, model_version=base_version)
    MessageFactory(trace=trace, position=0, role="user", content="Refund order A1")
    turn = MessageFactory(trace=trace, position=1, role="assistant", content="Done!", model_version=base_version)
    assert done_steps(tour_page()) == ["traces"]
    # Another deployment's tour is its own.
    assert done_steps(tour_page(deployment="another")) == []

    comment_add(message=turn, author=operator, body="It refunded without looking the order up.")
    assert done_steps(tour_page()) == ["traces", "comment"]

    failed = JudgeResult.objects.create(
        trace=trace,
        message=turn,
        trigger="comment",
        status=JudgeStatus.FAILED,
        error="output cut off at max_tokens (400) (after 2 attempts)",
        is_latest=True,
    )
    html = tour_page()
    assert "judge" not in done_steps(html)
    assert "the latest judgement failed (output cut off at max_tokens (400) (after 2 attempts)): judge again" in html
    JudgeResult.objects.filter(pk=failed.pk).update(is_latest=False)  # as judging again does
    JudgeResult.objects.create(
        trace=trace,
        message=turn,
        trigger="comment",
        status=JudgeStatus.SUCCEEDED,
        rubric={"criteria": [{"criterion": "looks the order up first", "weight": 1}]},
        reward=0.2,
        is_latest=True,
    )
    html = tour_page()
    assert done_steps(html) == ["traces", "comment", "judge"]
    assert "latest reward 0.20 under a rubric of 1 criterion" in html

    # A set from a fine-tuning file (an SDK script's) is not the step's artefact, nor a job on it.
    imported = training_set_create(
        name="fine-tuning-file-1",
        items=[{"key": "ft:1", "messages": [{"role": "user", "content": "Hi"}], "corrected_response": "Hello"}],
        deployment=deployment,
        selection={"kind": "fine-tuning file", "training_file": "file-1"},
        heldout_fraction=0.0,
    )
    TrainingJob.objects.create(
        kind="sft",
        status=WorkStatus.FINISHED,
        config={"kind": "sft", "steps": 4},
        base_version=base_version,
        training_set=imported,
        deployment=deployment,
        result_version=model_version_create(
            name="smol-sdk",
            base_model=base,
            kind="lora",
            path=make_adapter_folder(tmp_path / "sdk"),
            parent=base_version,
        ),
        finished_at=timezone.now(),
    )
    html = tour_page()
    assert done_steps(html) == ["traces", "comment", "judge"]
    assert "fine-tuning-file-1" in html and "not this step&#x27;s" in html

    training_set = training_set_from_feedback(
        name="refunds",
        filters={"comment": "yes", "deployment": deployment.pk},
        heldout_fraction=0.0,
        user=operator,
        judge_gate_override_reason="the tour's walk-through",
    )
    assert done_steps(tour_page())[-1] == "training_set"

    candidate = model_version_create(
        name="smol-v1", base_model=base, kind="lora", path=make_adapter_folder(tmp_path / "v1"), parent=base_version
    )
    job = TrainingJob.objects.create(
        kind="grpo",
        status=WorkStatus.RUNNING,
        config={"kind": "grpo", "steps": 4},
        base_version=base_version,
        training_set=training_set,
        step=1,
        total_steps=4,
    )
    html = tour_page()
    assert "job" not in done_steps(html) and "step 1/4" in html
    assert 'hx-trigger="every 3s"' in html  # the page follows a running job
    job.status, job.result_version, job.finished_at = WorkStatus.FINISHED, candidate, timezone.now()
    job.save()
    html = tour_page()
    assert done_steps(html)[-1] == "job" and "candidate smol-v1" in html

    evaluation = evaluation_row(candidate, deployment, base_version)
    html = tour_page()
    assert done_steps(html)[-1] == "evaluate" and "win rate 75%" in html

    promotion = PromotionRequest.objects.create(
        deployment=deployment,
        candidate=candidate,
        from_version=base_version,
        evaluation=evaluation,
        requested_by=operator,
    )
    assert "waits for an approver" in tour_page()
    approver = user_with_role("approver", "arno")
    promotion.status, promotion.decided_by, promotion.decided_at = PromotionStatus.DEPLOYED, approver, timezone.now()
    promotion.save()
    live_version_set(deployment=deployment, version=candidate)
    html = tour_page()
    assert done_steps(html)[-1] == "promote" and "approved by arno" in html
    assert '<b id="tour-live">smol-v1</b>' in html
    assert 'id="run-agent"' in html

    # One call through the gateway is not the agent's run.
    TraceFactory(deployment=deployment, model_version=candidate, metadata={})
    assert done_steps(tour_page())[-1] == "promote"
    # An episode of the agent served by the new version: the run; the improvement needs grades.
    episode = TraceFactory(deployment=deployment, model_version=candidate, metadata={"task_id": "t1", "split": "test"})
    MessageFactory(trace=episode, position=0, role="user", content="Refund order B2")
    html = tour_page()
    assert done_steps(html)[-1] == "rerun" and "needs graded episodes of the new version" in html
    Grade.objects.create(deployment=deployment, trace=episode, outcome=GradeOutcome.SUCCESS, source="support-desk")
    html = tour_page()
    assert done_steps(html)[-1] == "rerun" and "none of another version to compare" in html
    Grade.objects.create(deployment=deployment, trace=trace, outcome=GradeOutcome.FAILURE, source="support-desk")
    html = tour_page()
    assert "1 graded episodes of smol-v1, beside another version" in html
    assert done_steps(html) == [
        "traces",
        "comment",
        "judge",
        "training_set",
        "job",
        "evaluate",
        "promote",
        "rerun",
        "overview",
    ]
    assert "9</b> of 9 steps done" in html


def test_the_tour_is_for_people_who_read_traces(client):
    client.force_login(user_with_role("reviewer", "rita"))
    assert client.get(reverse("tour")).status_code == 403
    client.force_login(user_with_role("approver", "arno"))
    assert client.get(reverse("tour")).status_code == 200
    assert client.get(reverse("tour"), {"deployment": "nope"}).status_code == 404


def test_running_the_agent_again_is_queued_for_operators(client, operator, django_capture_on_commit_callbacks):
    DeploymentFactory(name="support-bot")
    url = reverse("tour-agent-run", args=["support-bot"])

    client.force_login(user_with_role("approver", "arno"))
    assert client.post(url, {"episodes": "4"}).status_code == 403
    assert 'id="run-agent"' not in client.get(reverse("tour")).content.decode()

    client.force_login(operator)
    for bad, reason in [("0", "between 1 and"), ("lots", "whole number"), ("100000", "between 1 and")]:
        with django_capture_on_commit_callbacks() as queued:
            response = client.post(url, {"episodes": bad})
        assert response.status_code == 400
        assert "episodes: must be" in response.content.decode() and reason in response.content.decode()
        assert queued == []
    assert client.post(reverse("tour-agent-run", args=["nope"]), {"episodes": "4"}).status_code == 404

    with django_capture_on_commit_callbacks() as queued:
        response = client.post(url, {"episodes": "4"})
    assert response.status_code == 302 and response.url == f"{reverse('tour')}?deployment=support-bot"
    assert len(queued) == 1  # one task, sent once the request's transaction commits
    assert "4 test tasks" in client.get(response.url).content.decode()


def test_the_job_step_offers_settings_a_job_accepts(tour_page):
    import html as html_lib
    import json

    from training.trainer.config import config_from_dict
    from webapp.site.selectors_tour import comment_job_settings, episode_job_settings

    DeploymentFactory(name="support-bot")
    page = tour_page()
    shown = re.search(r'<pre class="hint"><code>(.*?)</code></pre>', page, re.S).group(1)
    settings_json = json.loads(html_lib.unescape(shown))
    # The comments path is the default: a self-distillation job on the comments set.
    assert settings_json == json.loads(comment_job_settings())
    config = config_from_dict({**settings_json, "kind": "distill", "model_path": "/models/x"})
    assert config.steps == 40 and config.samples_per_prompt == 2
    # The oracle path is offered by its name, with the settings make tour-demo measures.
    oracle = json.loads(episode_job_settings())
    assert config_from_dict({**oracle, "kind": "sft", "model_path": "/models/x"}).steps == 200
    assert "oracle labels (computed from the environment&#x27;s hidden answer)" in page


def test_the_training_steps_lead_to_the_comments_set_and_a_distillation_job(tour_page, client):
    deployment = DeploymentFactory(name="support-bot")
    TraceFactory(deployment=deployment)
    page = tour_page()
    set_link = re.search(r'id="step-training_set".*?<a href="([^"]+)"', page, re.S).group(1)
    job_link = re.search(r'id="step-job".*?<a href="([^"]+)"', page, re.S).group(1)

    built = client.get(set_link.replace("&amp;", "&"))
    assert built.status_code == 200
    html = built.content.decode()
    # The feedback form is filled in with this deployment's commented traces.
    form = re.search(r'<form[^>]*id="set-form".*?</form>', html, re.S).group(0)
    assert f'name="filters" value="comment=yes&amp;deployment={deployment.pk}"' in form
    # The episode form says what its corrected turns are.
    assert "oracle labels (computed from the environment's hidden answer)" in html

    started = client.get(job_link.replace("&amp;", "&")).content.decode()
    assert re.search(r'<option value="distill" selected>', started)
    # A kind that is none is ignored: the form keeps its default.
    unknown = client.get(reverse("training:job-list"), {"kind": "<script>"})
    assert unknown.status_code == 200 and '<option value="grpo" selected>' in unknown.content.decode()


def test_the_trace_to_comment_on_is_never_a_held_out_tasks():
    from webapp.site.selectors_tour import tour_get

    deployment = DeploymentFactory(name="support-bot")
    train = TraceFactory(deployment=deployment, external_id="t-train", metadata={"split": "train"})
    unsplit = TraceFactory(deployment=deployment, external_id="t-plain", metadata={})
    for name in ("test", "fresh"):  # newer than both: make demo's base measurement comes last
        TraceFactory(deployment=deployment, external_id=f"t-{name}", metadata={"split": name})

    (comment_step,) = [s for s in tour_get(deployment=deployment).steps if s.key == "comment"]

    assert comment_step.link == reverse("feedback:trace-detail", args=[unsplit.pk])
    unsplit.delete()
    (comment_step,) = [s for s in tour_get(deployment=deployment).steps if s.key == "comment"]
    assert comment_step.link == reverse("feedback:trace-detail", args=[train.pk])


def test_while_a_release_walks_its_steps_the_tour_links_its_page_and_sends_enough_traffic(
    tour_page, operator, tmp_path, settings
):
    from training.promotion.rollout_models import Rollout, RolloutState

    settings.DEMO_AGENT_EPISODES = 4
    deployment = DeploymentFactory(name="support-bot")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    base, base_version = base_model_register(name="smol", path=tmp_path / "base")
    live_version_set(deployment=deployment, version=base_version)
    candidate = model_version_create(
        name="smol-v1", base_model=base, kind="lora", path=make_adapter_folder(tmp_path / "a"), parent=base_version
    )
    promotion = PromotionRequest.objects.create(
        deployment=deployment,
        candidate=candidate,
        from_version=base_version,
        evaluation=evaluation_row(candidate, deployment, base_version),
        requested_by=operator,
        status=PromotionStatus.APPROVED,
        decided_by=user_with_role("approver", "arno"),
        decided_at=timezone.now(),
    )
    steps = [
        {"share": 0.1, "min_conversations": 3, "min_minutes": 1},
        {"share": 0.5, "min_conversations": 5, "min_minutes": 1},
        {"share": 1.0, "min_conversations": 0, "min_minutes": 0},
    ]
    rollout = Rollout.objects.create(
        deployment=deployment,
        candidate=candidate,
        baseline=base_version,
        promotion=promotion,
        plan={"name": "demo-steps", "steps": steps, "thresholds": {}},
        state=RolloutState.RUNNING,
    )

    html = tour_page()
    promote = re.search(r'id="step-promote".*?</li>', html, re.S).group(0)
    assert "in steps: 10 % of new conversations, step 1 of 3 (running; plan demo-steps)" in promote
    assert f'href="/rollouts/{rollout.pk}/"' in promote and "The release" in promote
    rerun = re.search(r'id="step-rerun".*?</li>', html, re.S).group(0)
    assert "smol-v1 answers 10 % of new conversations" in rerun
    # At 10 % with a minimum of 3 conversations: 60 tasks, twice what the candidate needs on average.
    assert 'name="episodes" value="60"' in rerun and "Run the agent on 60 test tasks" in rerun

    Rollout.objects.filter(pk=rollout.pk).update(step=1)
    assert 'name="episodes" value="20"' in tour_page()
    Rollout.objects.filter(pk=rollout.pk).update(state=RolloutState.ROLLED_BACK)
    assert 'name="episodes" value="4"' in tour_page()
