"""/api/v1/jobs and /api/v1/models: a script starts a job, follows it, reads its metrics and
cancels it, with the jobs page's permissions; bad input is a 400 naming the field."""

from __future__ import annotations

import pytest

from tests.factories import user_with_role
from training.models import JobEventKind, TrainingJob, TrainingJobEvent
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db
CONFIG = {"steps": 3, "prompts_per_step": 2, "group_size": 4, "max_new_tokens": 6, "eval_every": 0}


def _nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_script_starts_a_job_follows_it_reads_its_metrics_and_cancels_it(
    client, base_version, task_set, django_capture_on_commit_callbacks
):
    operator = user_with_role("operator", "olga")
    client.force_login(operator)
    with django_capture_on_commit_callbacks() as queued:
        answer = client.post(
            "/api/v1/jobs",
            {"kind": "grpo", "base_version": "tiny-base", "training_set": task_set.pk, "config": CONFIG},
            content_type="application/json",
        )
    assert answer.status_code == 201, answer.content
    job = answer.json()
    assert (job["status"], job["base_version"], job["steps"]) == ("queued", "tiny-base", 3) and len(queued) == 1
    assert job["progress"]["percent"] == 0 and job["created_by"] == "olga"

    TrainingJob.objects.filter(pk=job["id"]).update(status=WorkStatus.RUNNING, step=2)
    for step, reward in ((1, 0.25), (2, 0.5)):
        TrainingJobEvent.objects.create(
            job_id=job["id"], kind=JobEventKind.STEP, step=step, data={"reward_mean": reward}
        )
    detail = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert detail["status"] == "running" and detail["step"] == 2 and detail["latest"]["reward_mean"] == 0.5
    assert client.get(f"/api/v1/jobs/{job['id']}/metrics").json()["reward_mean"] == [[1, 0.25], [2, 0.5]]
    assert [j["id"] for j in client.get("/api/v1/jobs", {"status": "running"}).json()["results"]] == [job["id"]]
    assert client.get("/api/v1/jobs", {"status": "queued"}).json()["results"] == []

    cancelled = client.post(f"/api/v1/jobs/{job['id']}/cancel").json()
    assert cancelled["status"] == "cancelling"  # a running job stops at its next step
    assert [v["name"] for v in client.get("/api/v1/models").json()["results"]] == ["tiny-base"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "magic", "base_version": "tiny-base"}, "kind"),
        ({"kind": "grpo", "base_version": "nope", "training_set": 1}, "base_version"),
        ({"kind": "grpo", "base_version": "tiny-base"}, "training_set"),
        ({"kind": "grpo", "base_version": "tiny-base", "training_set": 999999}, "training_set"),
        ({"kind": "grpo", "base_version": "tiny-base", "training_set": 0, "config": {"steps": -3}}, "training_set"),
    ],
)
def test_a_job_that_cannot_start_is_a_400_naming_the_field(client, base_version, task_set, body, field):
    client.force_login(user_with_role("operator"))

    answer = client.post("/api/v1/jobs", body, content_type="application/json")

    assert answer.status_code == 400 and answer.json()["errors"][0]["field"] == field, answer.content
    assert not TrainingJob.objects.exists()


def test_a_bad_setting_is_named_and_reading_or_starting_needs_the_pages_permissions(client, base_version, task_set):
    client.force_login(user_with_role("operator"))
    answer = client.post(
        "/api/v1/jobs",
        {"kind": "grpo", "base_version": "tiny-base", "training_set": task_set.pk, "config": {"steps": "many"}},
        content_type="application/json",
    )
    assert answer.status_code == 400 and "steps" in answer.json()["detail"]
    assert client.get("/api/v1/jobs", {"limit": "0"}).status_code == 400
    assert client.get("/api/v1/jobs", {"status": "done"}).status_code == 400

    client.force_login(user_with_role("reviewer"))
    assert client.get("/api/v1/jobs").status_code == 403
    client.logout()
    assert client.get("/api/v1/jobs").status_code in (401, 403)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"base_version": "²"}, "base_version"),
        ({"base_version": "9" * 5000}, "base_version"),
        ({"config": {**CONFIG, "steps": 10**30}}, "config.steps"),
        ({"config": {**CONFIG, "structured_outputs": _nested(500)}}, "config"),
    ],
)
def test_hostile_settings_are_a_400_not_a_500(client, base_version, task_set, body, field):
    client.force_login(user_with_role("operator"))
    payload = {"kind": "grpo", "base_version": "tiny-base", "training_set": task_set.pk, "config": CONFIG} | body

    answer = client.post("/api/v1/jobs", payload, content_type="application/json")

    assert answer.status_code == 400 and answer.json()["errors"][0]["field"] == field, answer.content[:300]


def test_a_job_that_has_ended_cannot_be_cancelled_and_a_queued_one_is_at_once(client, base_version, task_set):
    from training.services.jobs import training_job_create

    client.force_login(user_with_role("operator"))
    done = training_job_create(
        kind="grpo", config=CONFIG, base_version=base_version, training_set=task_set, enqueue=False
    )
    TrainingJob.objects.filter(pk=done.pk).update(status=WorkStatus.FINISHED)
    queued = training_job_create(
        kind="grpo", config=CONFIG, base_version=base_version, training_set=task_set, enqueue=False
    )

    assert client.post(f"/api/v1/jobs/{done.pk}/cancel").status_code == 409
    assert client.post(f"/api/v1/jobs/{queued.pk}/cancel").json()["status"] == "cancelled"
