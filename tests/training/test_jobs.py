"""Training jobs through their services, in process: lifecycle, candidate versions,
cancel, the stale-heartbeat check, training sets and their stable split."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from training.models import JobEventKind, TrainingJob, TrainingSplit
from training.services.jobs import JobError, training_job_cancel, training_job_create, training_jobs_check_stale
from training.services.training_sets import split_for, training_set_from_tasks
from training.serving.models import LiveVersion, ModelVersion, ModelVersionKind, ModelVersionStatus
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db

TASKS = [{"prompt": f"Say something about order A{i}.", "reference": "e", "grader": "contains"} for i in range(12)]
FAST = {
    "steps": 3,
    "prompts_per_step": 2,
    "group_size": 4,
    "max_new_tokens": 6,
    "eval_every": 3,
    "eval_samples": 2,
    "checkpoint_every": 2,
    "samples_every": 2,
    "learning_rate": 1e-3,
}


def test_a_job_runs_to_a_candidate_version_without_touching_the_live_one(base_version, task_set):
    from training.services.job_start import training_job_run

    job = training_job_create(kind="grpo", config=FAST, base_version=base_version, training_set=task_set)
    assert job.status == WorkStatus.QUEUED and job.total_steps == 3
    assert job.config["model_path"] == base_version.path

    assert training_job_run(job_id=job.pk, worker="w1") == WorkStatus.FINISHED
    job.refresh_from_db()
    assert job.step == 3 and job.attempts == 1 and job.finished_at is not None
    steps = job.events.filter(kind=JobEventKind.STEP)
    assert [e.step for e in steps] == [1, 2, 3]
    assert {"reward_mean", "reward_std", "loss", "kl", "zero_variance_share", "response_length"} <= set(
        steps.last().data
    )
    assert job.events.filter(kind=JobEventKind.EVAL).count() == 2  # the start and step 3
    assert job.events.filter(kind=JobEventKind.SAMPLE).exists()

    version = job.result_version
    assert version.status == ModelVersionStatus.CANDIDATE and version.kind == ModelVersionKind.LORA
    assert version.parent == base_version and version.metadata["training_job"] == job.pk
    assert (Path(version.path) / "adapter_config.json").exists()
    base_version.refresh_from_db()
    assert base_version.status == "live" and not LiveVersion.objects.exists()

    # Every phase reported itself, in order, in the job's log; evaluations carry their time.
    logs = [e.data["message"] for e in job.events.filter(kind=JobEventKind.LOG).order_by("id")]
    phases = [m.split(" (")[0] for m in logs if not m.startswith(("queued", "started", "finished", "checkpoint"))]
    assert phases == [
        "loading the model",
        "evaluating",
        "evaluating",  # after the training steps: the final evaluation
        "exporting the trained model",
        "registering the candidate version",
    ]
    assert all(e.data.get("eval_seconds", -1) >= 0 for e in job.events.filter(kind=JobEventKind.EVAL))
    assert job.phase["name"] == "done"

    # A redelivered task for a finished job does nothing.
    assert training_job_run(job_id=job.pk, worker="w2") == "skipped"


def test_bad_requests_name_the_field(base_version, task_set):
    with pytest.raises(JobError) as err:
        training_job_create(kind="grpo", config={"group_size": 1}, base_version=base_version, training_set=task_set)
    assert err.value.errors[0][0] == "config.group_size"
    with pytest.raises(JobError) as err:
        training_job_create(
            kind="grpo", config={"model_path": "/etc"}, base_version=base_version, training_set=task_set
        )
    assert err.value.errors[0][0] == "config.model_path"
    with pytest.raises(JobError) as err:
        training_job_create(kind="sft", config={}, base_version=base_version, training_set=task_set)
    assert err.value.errors == [("training_set", "has no corrected responses to fine-tune on")]
    for weight in (0.5, None):
        with pytest.raises(JobError) as err:
            training_job_create(
                kind="sft", config={"first_token_weight": weight}, base_version=base_version, training_set=task_set
            )
        assert err.value.errors[0] == ("config.first_token_weight", "must be between 1 and 100")
    with pytest.raises(JobError) as err:
        training_job_create(
            kind="sft", config={"first_token_weight": "32"}, base_version=base_version, training_set=task_set
        )
    assert err.value.errors[0][0] == "config.first_token_weight"
    with pytest.raises(JobError):
        training_job_create(kind="nope", config={}, base_version=base_version, training_set=task_set)
    assert not TrainingJob.objects.exists()


def test_cancel_before_and_during_a_run(base_version, task_set):
    from training.services.job_start import training_job_run

    queued = training_job_create(kind="grpo", config=FAST, base_version=base_version, training_set=task_set)
    assert training_job_cancel(job=queued).status == WorkStatus.CANCELLED
    assert training_job_run(job_id=queued.pk, worker="w1") == "skipped"

    job = training_job_create(
        kind="grpo", config=FAST | {"steps": 50}, base_version=base_version, training_set=task_set
    )
    TrainingJob.objects.filter(pk=job.pk).update(status=WorkStatus.RUNNING, heartbeat_at=None)
    job.refresh_from_db()
    assert training_job_cancel(job=job).status == WorkStatus.CANCELLING
    assert training_job_run(job_id=job.pk, worker="w1") == WorkStatus.CANCELLED
    job.refresh_from_db()
    assert job.step < 50 and job.result_version is None and job.checkpoint_path


def test_stale_heartbeats_resume_then_fail_never_stay_running(base_version, task_set, settings):
    settings.TRAINING_STALE_AFTER_SECONDS = 60
    settings.TRAINING_MAX_ATTEMPTS = 2
    now = timezone.now()
    make = lambda **kw: TrainingJob.objects.create(  # noqa: E731
        kind="grpo", config={}, base_version=base_version, training_set=task_set, **kw
    )
    resumable = make(status=WorkStatus.RUNNING, heartbeat_at=now - timedelta(seconds=61), attempts=1)
    exhausted = make(status=WorkStatus.RUNNING, heartbeat_at=now - timedelta(seconds=600), attempts=2)
    cancelling = make(status=WorkStatus.CANCELLING, heartbeat_at=now - timedelta(seconds=600), attempts=1)
    alive = make(status=WorkStatus.RUNNING, heartbeat_at=now - timedelta(seconds=5), attempts=1)

    actions = dict(training_jobs_check_stale(now=now))
    assert actions == {resumable.pk: "requeued", exhausted.pk: "failed", cancelling.pk: "cancelled"}
    statuses = dict(TrainingJob.objects.values_list("pk", "status"))
    assert statuses[resumable.pk] == WorkStatus.QUEUED
    assert statuses[exhausted.pk] == WorkStatus.FAILED
    assert statuses[cancelling.pk] == WorkStatus.CANCELLED
    assert statuses[alive.pk] == WorkStatus.RUNNING
    assert "heartbeats" in TrainingJob.objects.get(pk=exhausted.pk).error


def test_the_split_is_stable_across_rebuilds():
    first = training_set_from_tasks(name="qa", tasks=TASKS, heldout_fraction=0.3)
    second = training_set_from_tasks(name="qa", tasks=[*reversed(TASKS), TASKS[0] | {"prompt": "new"}])
    assert (first.version, second.version) == (1, 2)
    split_one = dict(first.items.values_list("key", "split"))
    split_two = dict(second.items.values_list("key", "split"))
    assert all(split_two[k] == v for k, v in split_one.items())
    assert first.heldout_count == sum(1 for v in split_one.values() if v == TrainingSplit.HELDOUT) > 0
    assert split_for("x", 0.0) == TrainingSplit.TRAIN and split_for("x", 0.999999) == TrainingSplit.HELDOUT


def test_import_tasks_command(tmp_path):
    import json

    from django.core.management import CommandError, call_command

    path = tmp_path / "tasks.jsonl"
    path.write_text("\n".join(json.dumps(t) for t in TASKS) + "\n")
    call_command("import_tasks", str(path), "--name", "cmd")
    path.write_text('{"prompt": "x", "reference": "y", "grader": "vibes"}\n')
    with pytest.raises(CommandError, match="grader"):
        call_command("import_tasks", str(path), "--name", "cmd")
    from training.models import TrainingSet

    assert list(TrainingSet.objects.filter(name="cmd").values_list("version", "item_count")) == [(1, 12)]


def test_a_job_can_continue_from_a_lora_candidate(base_version, task_set):
    from training.services.job_start import training_job_run

    first = training_job_create(kind="grpo", config=FAST, base_version=base_version, training_set=task_set)
    training_job_run(job_id=first.pk, worker="w1")
    candidate = TrainingJob.objects.get(pk=first.pk).result_version
    second = training_job_create(kind="grpo", config=FAST, base_version=candidate, training_set=task_set)
    assert second.config["init_adapter"] == candidate.path and second.config["model_path"] == base_version.path
    with pytest.raises(JobError):
        training_job_create(
            kind="grpo", config=FAST | {"adapter": "full"}, base_version=candidate, training_set=task_set
        )
    assert training_job_run(job_id=second.pk, worker="w1") == WorkStatus.FINISHED
    child = TrainingJob.objects.get(pk=second.pk).result_version
    assert (
        child.parent == candidate
        and child.kind == ModelVersionKind.LORA
        and child.base_model == base_version.base_model
    )


def test_a_job_continued_from_a_lora_version_measures_its_kl_from_that_version(base_version, task_set, tmp_path):
    """The reference is base + the version's adapter, not the bare base model: before the
    first update the policy is that version, so the first step's KL is 0."""
    from tests.fixtures.adapters import random_adapter_make
    from training.services.job_start import training_job_run

    adapter = random_adapter_make(Path(base_version.path), tmp_path / "adapter")
    version = ModelVersion.objects.create(
        name="tiny-lora",
        base_model=base_version.base_model,
        kind=ModelVersionKind.LORA,
        path=str(adapter),
        parent=base_version,
    )
    config = FAST | {"steps": 1, "eval_every": 0, "beta": 0.05, "drop_zero_variance": False}
    job = training_job_create(kind="grpo", config=config, base_version=version, training_set=task_set)
    assert training_job_run(job_id=job.pk, worker="w1") == WorkStatus.FINISHED
    first = job.events.get(kind=JobEventKind.STEP, step=1)
    assert first.data["kl"] == pytest.approx(0.0, abs=1e-6)


def test_grpo_on_turns_needs_something_to_score_against(base_version):
    from training.services.training_sets import training_set_create

    turns = training_set_create(
        name="turns",
        items=[{"key": "turn:1:a:1", "messages": [{"role": "user", "content": "hi"}], "feedback": ""}],
        heldout_fraction=0.0,
    )
    with pytest.raises(JobError) as err:
        training_job_create(kind="grpo", config=FAST, base_version=base_version, training_set=turns)
    assert "rubric" in err.value.errors[0][1]


def test_grpo_on_logged_turns_scores_each_group_with_the_judge(base_version, judge_settings):
    from feedback.models import CandidateScoring
    from tests.factories import user_with_role
    from tests.fixtures.judge import presented_responses, user_prompt
    from training.services.job_start import training_job_run
    from training.services.training_sets import training_set_create

    def judge(request):
        shown = presented_responses(request)
        return {"scores": [{"response": i, "reason": "r", "score": float("e" in t)} for i, t in enumerate(shown, 1)]}

    judge_settings.respond_with(judge)
    rubric = {"criteria": [{"criterion": "Apologises for the delay", "weight": 1}]}
    turns = training_set_create(
        name="turns",
        items=[
            {
                "key": f"turn:1:t{i}:1",
                "messages": [{"role": "user", "content": f"Order A{i} is late!"}],
                "rubric": rubric,
            }
            for i in range(4)
        ],
        heldout_fraction=0.0,
    )
    create = {"kind": "grpo", "config": FAST | {"steps": 2, "eval_every": 0}, "base_version": base_version}
    with pytest.raises(JobError) as closed:  # nothing calibrates this judge: its training gate is closed
        training_job_create(**create, training_set=turns)
    assert closed.value.errors[0][0] == "judge_gate_override_reason"
    job = training_job_create(
        **create,
        training_set=turns,
        user=user_with_role("operator", "olga"),
        judge_gate_override_reason="mechanics test on a scripted judge",
    )
    assert training_job_run(job_id=job.pk, worker="w1") == WorkStatus.FINISHED
    assert len(judge_settings.requests) >= 2  # at least one call per group
    # Every scoring call is kept, like a judgement.
    stored = CandidateScoring.objects.filter(training_job_id=job.pk)
    assert stored.count() == len(judge_settings.requests)
    assert all(s.raw_output and s.judge_model == "test-judge" for s in stored)
    assert "Apologises for the delay" in user_prompt(judge_settings.requests[0])
    rewards = [e.data["reward_mean"] for e in TrainingJob.objects.get(pk=job.pk).events.filter(kind="step")]
    assert len(rewards) == 2 and all(0.0 <= r <= 1.0 for r in rewards)


def test_a_job_is_queued_for_a_worker_unless_its_caller_runs_it_itself(
    base_version, task_set, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as queued:
        training_job_create(kind="grpo", config=FAST, base_version=base_version, training_set=task_set)
    assert len(queued) == 1
    # A script that runs the job in its own process must not also hand it to a worker.
    with django_capture_on_commit_callbacks() as queued:
        job = training_job_create(
            kind="grpo", config=FAST, base_version=base_version, training_set=task_set, enqueue=False
        )
    assert queued == [] and job.status == WorkStatus.QUEUED


def test_a_worker_that_ends_after_the_stale_check_failed_its_job_does_not_overwrite_it(
    base_version, task_set, settings
):
    from types import SimpleNamespace

    from training.services.job_runner import _finish

    settings.TRAINING_STALE_AFTER_SECONDS = 60
    settings.TRAINING_MAX_ATTEMPTS = 2
    now = timezone.now()
    job = TrainingJob.objects.create(
        kind="grpo",
        config={},
        base_version=base_version,
        training_set=task_set,
        status=WorkStatus.RUNNING,
        worker="w1",
        heartbeat_at=now - timedelta(seconds=600),
        attempts=2,
    )
    assert training_jobs_check_stale(now=now) == [(job.pk, "failed")]
    # The worker was only stalled: its loop now ends and it writes its outcome.
    stopped = SimpleNamespace(status="stopped", step=3, breaches=[{"message": "reward collapsed"}])
    assert _finish(job.pk, "w1", stopped) == "skipped"
    job.refresh_from_db()
    assert job.status == WorkStatus.FAILED and "heartbeats" in job.error and job.result_version is None


def test_a_worker_whose_job_another_took_over_writes_nothing_more(base_version, task_set, monkeypatch):
    """The sweep gave the job to worker B while A was still training: A's next step writes
    no event and no checkpoint into the folder B resumes from, and A ends as "skipped"."""
    from training.services import job_runner, job_start

    job = training_job_create(
        kind="grpo",
        config={**FAST, "steps": 4, "checkpoint_every": 1},
        base_version=base_version,
        training_set=task_set,
    )
    phases = job_runner.job_phase_set

    def taken_over_at_step_3(job_id, worker, name, done=0, total=0):
        if name == "update" and done == 3:
            TrainingJob.objects.filter(pk=job_id).update(worker="B")  # the sweep requeued it; B claimed it
        return phases(job_id, worker, name, done, total)

    monkeypatch.setattr(job_runner, "job_phase_set", taken_over_at_step_3)

    assert job_start.training_job_run(job_id=job.pk, worker="A") == "skipped"
    job.refresh_from_db()
    assert job.worker == "B" and job.status == WorkStatus.RUNNING  # B's, untouched by A
    assert [e.step for e in job.events.filter(kind=JobEventKind.STEP)] == [1, 2]
    checkpoints = sorted(p.name for p in (job_runner.job_run_dir(job) / "checkpoints").iterdir())
    assert "step-000003" not in checkpoints and not (job_runner.job_run_dir(job) / "model").exists()
    assert job_runner.job_run_dir(job).joinpath("checkpoints", "latest").read_text().strip().endswith("2")


@pytest.mark.django_db
def test_a_models_text_with_nul_is_logged_without_failing_the_job(base_version, task_set):
    """A model may generate U+0000 (a random tiny one did, in a sample row); PostgreSQL's jsonb
    cannot hold it, and the job failed writing its samples."""
    from training.models import TrainingJobEvent
    from training.services.job_runner import job_event_add
    from training.services.jobs import training_job_create

    job = training_job_create(kind="grpo", config={}, base_version=base_version, training_set=task_set, enqueue=False)

    job_event_add(job.pk, "sample", 1, {"rows": [{"response": "refund\x00 please", "a\x00": 1}]})

    (event,) = TrainingJobEvent.objects.filter(job=job, kind="sample")
    assert event.data == {"rows": [{"response": "refund\ufffd please", "a\ufffd": 1}]}
