"""Hinted GRPO as a job: set on the jobs page, the API or a script's config like any GRPO
setting; refused on a set without comments; a job's steps log what the hints did."""

from __future__ import annotations

import json

import pytest

from tests.factories import user_with_role
from training.models import JobEventKind, TrainingJob
from training.services.jobs import JobError, training_job_create
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db

HINTED = {"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 6, "eval_every": 0}
HINTED |= {"samples_every": 1, "checkpoint_every": 0, "hint_samples": 2, "log_kl": False}


def test_hint_samples_on_a_set_without_comments_are_refused_by_the_service_and_the_api(client, base_version, task_set):
    with pytest.raises(JobError) as err:
        training_job_create(kind="grpo", config=HINTED, base_version=base_version, training_set=task_set)
    assert err.value.errors[0][0] == "config.hint_samples" and "no feedback" in err.value.errors[0][1]

    client.force_login(user_with_role("operator"))
    answer = client.post(
        "/api/v1/jobs",
        {"kind": "grpo", "base_version": "tiny-base", "training_set": task_set.pk, "config": HINTED},
        content_type="application/json",
    )
    assert answer.status_code == 400 and answer.json()["errors"][0]["field"] == "config.hint_samples", answer.content
    answer = client.post(
        "/api/v1/jobs",
        {"kind": "grpo", "base_version": "tiny-base", "training_set": task_set.pk, "config": {"hint_cap": 0}},
        content_type="application/json",
    )
    assert answer.status_code == 400 and answer.json()["errors"][0]["field"] == "config.hint_cap", answer.content
    assert not TrainingJob.objects.exists()


def test_a_hinted_job_from_the_jobs_page_runs_and_logs_what_its_hints_did(client, base_version):
    from training.services.job_start import training_job_run
    from training.services.training_sets import training_set_from_tasks

    # Graded against a word the tiny random model does not write: every group fails.
    tasks = [
        {"prompt": f"Where is order A{i}?", "reference": "tracking-zq", "grader": "contains", "feedback": "Say sorry."}
        for i in range(4)
    ]
    commented = training_set_from_tasks(name="commented", tasks=tasks, heldout_fraction=0.0)
    client.force_login(user_with_role("operator"))
    form = {"kind": "grpo", "base_version": base_version.pk, "training_set": commented.pk, "hint_samples": "2"}
    config = {k: v for k, v in HINTED.items() if k != "hint_samples"}
    answer = client.post("/training/jobs/", {**form, "config": json.dumps(config)})
    assert answer.status_code == 302, answer.content.decode()[-2000:]
    job = TrainingJob.objects.get()
    assert job.config["hint_samples"] == 2 and job.config["hint_template"].endswith("{feedback}")

    assert training_job_run(job_id=job.pk, worker="w1") == WorkStatus.FINISHED
    steps = [e.data for e in job.events.filter(kind=JobEventKind.STEP).order_by("step")]
    assert [s["zero_variance_groups"] for s in steps] == [2, 2]
    assert [s["hinted_groups"] for s in steps] == [2, 2]
    assert all(s["hinted_groups_with_variance"] == 0 and s["trained_sequences"] == 0 for s in steps)
    rows = job.events.filter(kind=JobEventKind.SAMPLE, step=1).get().data["rows"]
    hinted = [r for r in rows if r.get("hint")]
    assert len(hinted) == 2 * 2 and all(
        r["hint"] == "Feedback on earlier answers, follow it: Say sorry." for r in hinted
    )
    page = client.get(f"/training/jobs/{job.pk}/", {"sample_step": 1}).content.decode()
    assert "drawn with the comment as a hint" in page and "Hinted groups that gained reward variance" in page
    metrics = client.get(f"/api/v1/jobs/{job.pk}/metrics").json()
    assert metrics["hinted_groups"] == [[1, 2], [2, 2]] and metrics["zero_variance_groups"] == [[1, 2], [2, 2]]


def test_hint_samples_on_a_set_whose_comments_are_only_blank_are_refused(base_version):
    from training.services.training_sets import training_set_from_tasks

    tasks = [
        {"prompt": f"Where is order A{i}?", "reference": "x", "grader": "contains", "feedback": " \n"} for i in range(4)
    ]
    blank = training_set_from_tasks(name="blank-comments", tasks=tasks, heldout_fraction=0.0)
    with pytest.raises(JobError) as err:
        training_job_create(kind="grpo", config=HINTED, base_version=base_version, training_set=blank)
    assert err.value.errors[0][0] == "config.hint_samples"
