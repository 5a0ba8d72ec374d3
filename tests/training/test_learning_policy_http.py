"""Learning policies over HTTP: the API's bodies and refusals, and the pages' forms."""

from __future__ import annotations

import pytest

from tests.factories import user_with_role
from tests.training.policies import commented_turns
from training.learning_policies.models import LearningPolicy, LearningPolicyRun, RunOutcome, RunStage
from training.learning_policies.tick import learning_policies_tick

pytestmark = pytest.mark.django_db

API = "/api/v1/learning-policies/"


def body(world, **values):
    return {
        "deployment": "support-bot",
        "name": "fix-lookups",
        "min_new_turns": 3,
        "job_kind": "distill",
        "job_config": {"steps": 2},
        "eval_training_set": str(world["eval_set"].pk),
        "min_win_rate": 0.6,
        "notify_user": "arno",
    } | values


def test_the_api_creates_lists_reads_and_changes_a_policy(world, client):
    client.force_login(world["olga"])
    created = client.post(API, body(world), content_type="application/json")
    assert created.status_code == 201, created.json()
    policy = created.json()
    assert (policy["deployment"], policy["created_by"], policy["notify_user"]) == ("support-bot", "olga", "arno")
    assert policy["eval_training_set"] == world["eval_set"].pk and policy["runs"] == []

    commented_turns(world["deployment"], 3)
    learning_policies_tick()
    listed = client.get(API, {"deployment": "support-bot"}).json()["results"]
    assert [p["name"] for p in listed] == ["fix-lookups"] and listed[0]["latest_run"] is not None
    detail = client.get(f"{API}{policy['id']}/").json()
    (run,) = detail["runs"]
    assert run["stage"] == "training" and run["job_status"] == "queued" and run["provenance"]["comments"] == 3

    changed = client.patch(
        f"{API}{policy['id']}/", {"min_win_rate_ci_low": 0.4, "enabled": False}, content_type="application/json"
    )
    assert changed.status_code == 200, changed.json()
    assert changed.json()["min_win_rate_ci_low"] == 0.4 and changed.json()["enabled"] is False


@pytest.mark.parametrize(
    ("values", "field", "reason"),
    [
        ({"job_config": {"steps": 0}}, "job_config.steps", "must be"),
        ({"signal": "rumours"}, "signal", "is not a valid choice"),
        ({"deployment": "nowhere"}, "deployment", "no deployment 'nowhere'"),
        ({"min_win_rate": 1.5}, "min_win_rate", "a rate between 0 and 1"),
        ({"min_new_turns": 0, "min_interval_minutes": 0}, "min_new_turns", "set a number of new turns"),
        ({"eval_training_set": "abc"}, "eval_training_set", "a training set's id"),
        ({"notify_user": "nobody"}, "notify_user", "no user 'nobody'"),
        ({"job_kind": "episodes"}, "job_kind", "is not a valid choice"),
        ({"name": "Not A Slug!"}, "name", "letters, digits"),
        ({"signal": "episodes"}, "environment", "graded episodes need the environment"),
        ({"job_config": {"steps": "many"}}, "job_config.steps", ""),
    ],
)
def test_bad_input_is_a_400_naming_the_field_and_the_reason(world, client, values, field, reason):
    client.force_login(world["olga"])
    response = client.post(API, body(world, **values), content_type="application/json")
    assert response.status_code == 400, response.content
    errors = {e["field"]: e["reason"] for e in response.json()["errors"]}
    assert field in errors and reason in errors[field], errors
    assert not LearningPolicy.objects.exists()


def test_who_may_read_create_and_change_policies(world, client):
    client.force_login(world["olga"])
    policy = client.post(API, body(world), content_type="application/json").json()
    client.force_login(world["arno"])  # approvers read the policies behind the requests they decide
    assert client.get(f"{API}{policy['id']}/").status_code == 200
    assert client.post(API, body(world, name="other"), content_type="application/json").status_code == 403
    assert client.patch(f"{API}{policy['id']}/", {"enabled": False}, "application/json").status_code == 403
    client.force_login(user_with_role("reviewer", "rita"))
    assert client.get(API).status_code == 403
    client.logout()
    assert client.get(API).status_code in (401, 403)
    assert client.get(f"{API}999/").status_code in (401, 403)


def test_the_pages_create_a_policy_show_field_errors_and_escape_what_a_run_recorded(world, client):
    client.force_login(world["olga"])
    form = {
        "name": "fix-lookups",
        "deployment": "support-bot",
        "enabled": "on",
        "signal": "comments",
        "min_new_turns": "x",
        "min_interval_minutes": "0",
        "job_kind": "distill",
        "job_config": "{}",
        "heldout_fraction": "0.2",
        "min_win_rate": "0.5",
        "eval_training_set": str(world["eval_set"].pk),
    }
    bad = client.post("/training/policies/", form)
    assert bad.status_code == 400 and "New turns with the signal, at least</a>: a whole number" in bad.content.decode()
    created = client.post("/training/policies/", form | {"min_new_turns": "2"})
    assert created.status_code == 302
    policy = LearningPolicy.objects.get(name="fix-lookups")
    assert created["Location"] == f"/training/policies/{policy.pk}/"

    LearningPolicyRun.objects.create(
        policy=policy,
        reason="2 new commented turns so far",
        stage=RunStage.DONE,
        outcome=RunOutcome.ERROR,
        error="evaluation not started: items: <script>alert(1)</script>",
    )
    page = client.get(f"/training/policies/{policy.pk}/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert "2 new commented turns so far" in page
    edited = client.post(f"/training/policies/{policy.pk}/", form | {"min_new_turns": "5", "min_win_rate": "7"})
    assert (
        edited.status_code == 400
        and "Win rate vs live, at least</a>: a rate between 0 and 1" in edited.content.decode()
    )
    policy.refresh_from_db()
    assert policy.min_new_turns == 2


def test_the_list_reads_a_fixed_number_of_queries_however_many_policies(world, client, django_assert_num_queries):
    from tests.training.policies import policy

    for name in ("a", "b", "c"):
        policy(world, name=name, min_new_turns=1)
    commented_turns(world["deployment"], 1)
    learning_policies_tick()
    client.force_login(world["olga"])
    # The session, the user, their own and their groups' permissions; the policies with their
    # latest runs' ids; those runs.
    with django_assert_num_queries(6):
        results = client.get(API).json()["results"]
    assert sorted(p["name"] for p in results) == ["a", "b", "c"]
    assert all(p["latest_run"] for p in results)
