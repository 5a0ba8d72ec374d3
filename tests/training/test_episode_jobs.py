"""An "episodes" job: created without a training set, run by the worker code on the tiny
model, its episodes stored as orchestrator traces that the dashboard shows (escaped),
and a candidate version registered; a real Celery worker runs one too."""

from __future__ import annotations

import pytest
from django.urls import reverse

from feedback.models import Trace, TraceSource
from tests.factories import user_with_role
from training.models import JobEventKind, TrainingJob
from training.services.jobs import JobError, training_job_create
from training.serving.models import BaseModel, Deployment, ModelVersion, ModelVersionKind
from webapp.kernel.work import WorkStatus

FAST = {
    "environment": "files",
    "environment_options": {"count": 5, "heldout": 1},
    "steps": 2,
    "group_size": 2,
    "prompts_per_step": 2,
    "max_new_tokens": 6,
    "max_episode_tokens": 12,
    "eval_every": 2,
    "eval_samples": 2,
    "log_kl": False,
}


@pytest.fixture
def version(db, tiny_model_dir, settings, tmp_path):
    settings.TRAINING_DIR = tmp_path / "training"
    settings.MODELS_DIR = tmp_path / "models"
    deployment = Deployment.objects.create(name="file-agent")
    base = BaseModel.objects.create(name="tiny", path=str(tiny_model_dir))
    return ModelVersion.objects.create(
        name="tiny-base", base_model=base, kind=ModelVersionKind.BASE, path=str(tiny_model_dir), deployment=deployment
    )


@pytest.mark.django_db
def test_an_episode_job_records_its_episodes_as_traces_and_yields_a_candidate(version, client):
    from training.services.job_start import training_job_run

    job = training_job_create(kind="episodes", config=FAST, base_version=version, training_set=None)
    assert job.deployment == version.deployment and job.training_set is None
    assert training_job_run(job_id=job.pk, worker="w1") == WorkStatus.FINISHED
    job.refresh_from_db()
    assert job.step == 2 and job.result_version is not None
    for key in ("tool_error_rate", "budget_exhaustion", "early_stop", "success"):
        assert key in job.metrics
    assert set(job.eval_metrics) == {"first", "latest"} and job.eval_metrics["latest"]["n"] == 2

    # 2 evaluations x 1 held-out task x 2 samples + 2 steps x 2 tasks x 2 episodes.
    traces = Trace.objects.filter(deployment=version.deployment)
    assert traces.count() == 12 and set(traces.values_list("source", flat=True)) == {TraceSource.ORCHESTRATOR}
    trace = traces.filter(metadata__phase="train", metadata__step=2).first()
    meta = trace.metadata
    assert trace.environment == "files" and meta["environment"] == "files"
    assert meta["model_version"] == f"tiny-base+job{job.pk}@step2" and meta["training_job"] == job.pk
    assert meta["task_id"].startswith("write-") and 0.0 <= meta["reward"] <= 1.0 and meta["reason"]
    roles = list(trace.messages.order_by("position").values_list("role", flat=True))
    assert roles[:5] == ["user", "assistant", "tool", "assistant", "user"] and roles[5] == "assistant"
    # Read in Python: SQLite has no `contains` lookup on a JSON key.
    logs = [str((e.data or {}).get("message", "")) for e in job.events.filter(kind=JobEventKind.LOG)]
    assert logs and not any("not recorded" in m for m in logs)

    # The job page charts the environment-fidelity figures next to the reward.
    client.force_login(user_with_role("operator"))
    job_page = client.get(reverse("training:job-detail", args=[job.pk])).content.decode()
    for title in ("Tool-error rate per episode", "Budget exhausted", "Early stops", "Reward (mean"):
        assert title in job_page

    # The dashboard shows an episode like any trace, with the model's text escaped.
    message = trace.messages.filter(role="assistant").first()
    message.content = "<script>alert(1)</script>"
    message.save(update_fields=["content"])
    page = client.get(reverse("feedback:trace-detail", args=[trace.pk]))
    assert page.status_code == 200
    body = page.content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and "<script>alert(1)" not in body


@pytest.mark.django_db
def test_bad_episode_job_requests_name_the_field(version):
    with pytest.raises(JobError) as exc:
        training_job_create(kind="episodes", config={"environment": "nowhere"}, base_version=version, training_set=None)
    assert exc.value.errors[0][0] == "config.environment"
    with pytest.raises(JobError) as exc:
        training_job_create(kind="grpo", config={}, base_version=version, training_set=None)
    assert exc.value.errors == [("training_set", "choose a training set")]


@pytest.mark.django_db
def test_the_jobs_page_starts_an_episode_job_without_a_training_set(version, client):
    client.force_login(user_with_role("operator"))
    response = client.post(
        reverse("training:job-list"),
        {"kind": "episodes", "base_version": version.pk, "config": '{"environment": "files", "steps": 1}'},
    )
    assert response.status_code in (302, 303), response.content.decode()[:2000]
    job = TrainingJob.objects.get()
    assert job.kind == "episodes" and job.config["environment"] == "files"
    bad = client.post(
        reverse("training:job-list"),
        {"kind": "episodes", "base_version": version.pk, "config": '{"environment": "nowhere"}'},
    )
    assert bad.status_code == 400 and "unknown environment" in bad.content.decode()


@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_celery_worker_runs_an_episode_job(tiny_model_dir, tmp_path):
    import subprocess
    import sys

    from tests.fixtures.worker import process_group_stop, wait_for
    from tests.training.test_jobs_worker import ROOT, _start_worker, _worker_env

    subprocess.run(
        [sys.executable, "-m", "celery", "-A", "webapp", "purge", "-f", "-Q", "training,default"],
        cwd=ROOT,
        env=_worker_env(tmp_path),
        capture_output=True,
        timeout=60,
    )
    deployment = Deployment.objects.create(name="file-agent")
    base = BaseModel.objects.create(name="tiny", path=str(tiny_model_dir))
    version = ModelVersion.objects.create(
        name="tiny-base", base_model=base, kind=ModelVersionKind.BASE, path=str(tiny_model_dir), deployment=deployment
    )
    worker = _start_worker(tmp_path, "episodes")
    try:
        job = training_job_create(kind="episodes", config=FAST, base_version=version, training_set=None)
        wait_for(
            lambda: TrainingJob.objects.get(pk=job.pk).status == WorkStatus.FINISHED, 240, "the episode job", tmp_path
        )
    finally:
        process_group_stop(worker)
    job = TrainingJob.objects.get(pk=job.pk)
    assert job.step == 2 and job.result_version is not None
    assert Trace.objects.filter(deployment=deployment, source=TraceSource.ORCHESTRATOR).count() == 12


@pytest.mark.django_db
def test_episode_rewards_combine_the_grader_with_the_judge_by_the_configured_weights(version, judge_settings):
    from tests.fixtures.judge import presented_responses
    from training.services.job_start import training_job_run

    def judge(request):
        shown = presented_responses(request)
        return {"scores": [{"response": i, "reason": "r", "score": 0.5} for i in range(1, len(shown) + 1)]}

    judge_settings.respond_with(judge)
    config = FAST | {"steps": 1, "eval_every": 0, "judge_weight": 3.0, "judge_rubric": "The agent answers briefly."}
    with pytest.raises(JobError, match="judge_gate_override_reason"):  # the judge's gate is closed
        training_job_create(kind="episodes", config=config, base_version=version, training_set=None)
    job = training_job_create(
        kind="episodes",
        config=config,
        base_version=version,
        training_set=None,
        user=user_with_role("operator", "olga"),
        judge_gate_override_reason="mechanics test on a scripted judge",
    )
    assert training_job_run(job_id=job.pk, worker="w1") == WorkStatus.FINISHED
    step = job.events.get(kind=JobEventKind.STEP).data
    assert step["judge_mean"] == 0.5
    assert step["reward_mean"] == pytest.approx((1.0 * step["grade_mean"] + 3.0 * 0.5) / 4.0)
    # One judge call per task group, each episode shown as its transcript after the opening.
    assert len(judge_settings.requests) == 2
    shown = presented_responses(judge_settings.requests[0])
    assert len(shown) == 2 and all(text.startswith("assistant:") for text in shown)
