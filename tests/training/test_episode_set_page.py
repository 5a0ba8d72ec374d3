"""The training page's "from the agent's graded episodes" form: a set of replayable turns
from a deployment's logged training-split episodes; bad input is a 400 naming the field."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from tests.factories import DeploymentFactory, MessageFactory, TraceFactory, user_with_role
from training.environments.support_desk import SupportDesk
from training.models import TrainingSet

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator_client(client):
    client.force_login(user_with_role("operator", "olga"))
    return client


def logged_episode(deployment, task, external_id: str):
    trace = TraceFactory(
        deployment=deployment,
        external_id=external_id,
        environment="support-desk",
        metadata={"environment": "support-desk", "task_id": task.id, "split": task.split},
        tools=task.tools,
    )
    MessageFactory(trace=trace, position=0, role="user", content=task.prompt)
    MessageFactory(trace=trace, position=1, role="assistant", content="Done, refunded!")
    return trace


def test_a_set_of_the_graded_training_episodes_is_built(operator_client):
    deployment = DeploymentFactory(name="support-bot")
    desk = SupportDesk()
    train = [t for t in desk.tasks() if t.split == "train" and t.hidden.get("graded")][:2]
    heldout = next(t for t in desk.tasks() if t.split == "test" and t.hidden.get("graded"))
    for i, task in enumerate([*train, heldout]):
        logged_episode(deployment, task, f"ep-{i}")

    page = operator_client.get(reverse("training:job-list")).content.decode()
    assert 'id="episode-form"' in page and '<option value="support-desk"' in page
    # The defaults are the tour's SFT recipe: corrected turns, and the first turns kept (an
    # SFT set without them teaches the agent to refund before it looks the order up).
    assert re.search(r'name="targets" value="1" checked', page)
    assert re.search(r'name="skip_first_turns" value="1">', page)

    response = operator_client.post(
        reverse("training:set-build-episodes"),
        {"name": "desk", "heldout_fraction": "0", "deployment": "support-bot", "environment": "support-desk"},
    )
    assert response.status_code == 302
    built = TrainingSet.objects.get(name="desk")
    assert response.url == f"{reverse('training:job-list')}?built={built.pk}#sets"
    items = list(built.items.all())
    assert len(items) == 2  # the held-out task's episode stays out
    assert {i.grader for i in items} == {"tool_action"} and all(i.reference for i in items)
    assert built.deployment == deployment
    assert not any(i.corrected_response for i in items)  # no corrected turns unless asked

    operator_client.post(
        reverse("training:set-build-episodes"),
        {
            "name": "desk",
            "heldout_fraction": "0",
            "deployment": "support-bot",
            "environment": "support-desk",
            "targets": "1",
        },
    )
    with_targets = TrainingSet.objects.filter(name="desk").latest("version")
    assert with_targets.version == built.version + 1
    # Each turn's accepted action, written as the agent's harness writes a turn: an SFT job's targets.
    assert all(i.corrected_response.startswith("<tool_call>") for i in with_targets.items.all())
    assert 'name="variants" type="number" min="0" max="16" id="episode-variants" value="0"' in page


@pytest.mark.parametrize(
    ("post", "field"),
    [
        ({"name": "bad name!"}, "name"),
        ({"heldout_fraction": "1.5"}, "heldout_fraction"),
        ({"deployment": "nope"}, "deployment"),
        ({"environment": "<script>x</script>"}, "environment"),
        ({"variants": "<script>x</script>"}, "variants"),
        ({"variants": "99", "targets": "1"}, "variants"),
        ({"variants": "2"}, "variants"),  # copies without corrected turns
    ],
)
def test_bad_input_is_refused_with_the_field(operator_client, post, field):
    DeploymentFactory(name="support-bot")
    data = {"name": "desk", "heldout_fraction": "0.1", "deployment": "support-bot", "environment": "support-desk"}
    response = operator_client.post(reverse("training:set-build-episodes"), data | post)
    assert response.status_code == 400
    # Named by its label, linked to its input, which is marked invalid.
    assert f'href="#episode-{field.replace("_", "-")}">' in response.content.decode()
    assert f'id="episode-{field.replace("_", "-")}" aria-invalid="true"' in response.content.decode()
    assert "<script>x</script>" not in response.content.decode()
    assert not TrainingSet.objects.exists()


def test_leaving_out_first_turns_leaves_nothing_of_one_turn_episodes(operator_client):
    deployment = DeploymentFactory(name="support-bot")
    task = next(t for t in SupportDesk().tasks() if t.split == "train" and t.hidden.get("graded"))
    logged_episode(deployment, task, "ep-0")
    data = {"name": "desk", "heldout_fraction": "0", "deployment": "support-bot", "environment": "support-desk"}
    response = operator_client.post(reverse("training:set-build-episodes"), data | {"skip_first_turns": "1"})
    assert response.status_code == 400 and not TrainingSet.objects.exists()
    assert operator_client.post(reverse("training:set-build-episodes"), data).status_code == 302


def test_no_episodes_yet_is_a_400_not_a_500(operator_client):
    DeploymentFactory(name="support-bot")
    data = {"name": "desk", "heldout_fraction": "0.1", "deployment": "support-bot", "environment": "support-desk"}
    response = operator_client.post(reverse("training:set-build-episodes"), data)
    assert response.status_code == 400


def test_reviewers_may_not_build_sets(client):
    client.force_login(user_with_role("reviewer", "rita"))
    assert client.post(reverse("training:set-build-episodes"), {"name": "x"}).status_code == 403
