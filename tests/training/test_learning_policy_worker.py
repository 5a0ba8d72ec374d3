"""The loop up to a person's approval, with real parts: `celery beat` sends the learning
policies' tick every second, a Celery worker on Redis runs it, the training job on the tiny
model and the candidate's evaluation against the live version, on PostgreSQL.

comments arrive → the policy fires → the job runs → the candidate is evaluated → a promotion
request waits for an approver; the live pointer never moves."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from feedback.services.review import comment_add
from tests.factories import DeploymentFactory, MessageFactory, TraceFactory, user_with_role
from tests.fixtures.worker import process_group_stop, wait_for
from training.learning_policies.models import LearningPolicyRun, RunOutcome
from training.learning_policies.services import learning_policy_create
from training.promotion.models import PromotionRequest, PromotionStatus
from training.services.training_sets import training_set_from_tasks
from training.serving.models import BaseModel, LiveVersion, LiveVersionChange, ModelVersion, ModelVersionKind
from webapp.kernel.work import WorkStatus

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]
TASKS = [{"prompt": f"Say something about order A{i}.", "reference": "e", "grader": "contains"} for i in range(12)]


def _env(tmp_path: Path) -> dict[str, str]:
    db = connection.settings_dict
    return os.environ | {
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "PRACTICUM_DATA_DIR": str(tmp_path / "data"),
        "PRACTICUM_TRAINING_DIR": str(tmp_path / "training"),
        "PRACTICUM_MODELS_DIR": str(tmp_path / "models"),
        "PRACTICUM_LEARNING_POLICY_TICK_SECONDS": "1",
        "PRACTICUM_EVAL_GENERATOR": "local",
        "PRACTICUM_EVAL_MAX_TOKENS": "4",
        "OMP_NUM_THREADS": "1",
    }


def _start(tmp_path: Path, name: str, *args: str) -> subprocess.Popen:
    log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115 - the process writes to it until stopped
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "webapp", *args],
        cwd=ROOT,
        env=_env(tmp_path),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def test_beat_fires_the_policy_and_the_request_waits_for_an_approver(tiny_model_dir, tmp_path):
    subprocess.run(
        [sys.executable, "-m", "celery", "-A", "webapp", "purge", "-f", "-Q", "training,default"],
        cwd=ROOT,
        env=_env(tmp_path),
        capture_output=True,
        timeout=60,
    )
    from training.serving.services import live_version_set

    base = BaseModel.objects.create(name="tiny", path=str(tiny_model_dir))
    live = ModelVersion.objects.create(
        name="tiny-base", base_model=base, kind=ModelVersionKind.BASE, path=str(tiny_model_dir)
    )
    deployment = DeploymentFactory(name="support-bot")
    live_version_set(deployment=deployment, version=live)
    changes = LiveVersionChange.objects.count()
    olga, arno = user_with_role("operator", "olga"), user_with_role("approver", "arno")
    policy = learning_policy_create(
        deployment=deployment,
        user=olga,
        name="fix-lookups",
        min_new_turns=3,
        job_kind="distill",
        # A learning rate this small leaves the candidate answering as the live version: ties.
        # A random tiny model runs every answer to max_new_tokens: that monitor is off here.
        job_config={
            "monitors": {"max_truncated_share": 1.0, "max_empty_share": 1.0, "length_tolerance": 10.0},
            "steps": 2,
            "prompts_per_step": 2,
            "samples_per_prompt": 2,
            "max_new_tokens": 4,
            "eval_every": 0,
            "learning_rate": 1e-9,
        },
        eval_training_set=training_set_from_tasks(name="orders", tasks=TASKS, heldout_fraction=0.25),
        # Evaluated on that set: a fraction of three turns held out by their keys' hash (which
        # hold the database's ids) would leave no training item in some orders of the suite.
        heldout_fraction=0.0,
        min_win_rate=0.5,
        notify_user=arno,
    )

    worker = _start(tmp_path, "worker", "worker", "-Q", "training,default", "-P", "solo", "--loglevel", "INFO")
    beat = _start(tmp_path, "beat", "beat", "--schedule", str(tmp_path / "beat-schedule"), "--loglevel", "INFO")
    try:
        for i in range(3):
            trace = TraceFactory(deployment=deployment, external_id=f"conv-{i}")
            MessageFactory(trace=trace, position=0, role="user", content=f"Where is order A{i}?")
            turn = MessageFactory(trace=trace, position=1, role="assistant", content="No idea.")
            if i == 2:
                # Two of three: beat ticks, the policy waits and says why.
                wait_for(
                    lambda: "2 of 3 commented turns" in type(policy).objects.get(pk=policy.pk).waiting_reason,
                    60,
                    "a tick that waits",
                    tmp_path,
                )
                assert not LearningPolicyRun.objects.exists()
            comment_add(message=turn, author=olga, body=f"Look order A{i} up before answering.")

        run = wait_for(lambda: LearningPolicyRun.objects.first(), 60, "the policy to fire", tmp_path)
        assert run.provenance["comments"] == 3
        run = wait_for(
            lambda: (r := LearningPolicyRun.objects.get(pk=run.pk)).finished_at and r, 420, "the run to end", tmp_path
        )
    finally:
        process_group_stop(beat)
        process_group_stop(worker)

    assert run.outcome == RunOutcome.REQUESTED, (run.error, run.checks)
    print(
        f"\nlearning policy run: fired → request opened in {(run.finished_at - run.fired_at).total_seconds():.1f} s "
        f"(job {(run.job.finished_at - run.job.created_at).total_seconds():.1f} s, evaluation "
        f"{(run.evaluation.finished_at - run.evaluation.created_at).total_seconds():.1f} s of it)"
    )
    assert run.job.status == WorkStatus.FINISHED and run.job.base_version == live
    assert run.evaluation.status == WorkStatus.FINISHED and run.evaluation.baseline == live
    assert run.evaluation.summary["comparison"]["n"] == run.evaluation.total > 0
    promotion = PromotionRequest.objects.get()
    assert promotion == run.promotion and promotion.status == PromotionStatus.PENDING
    assert promotion.candidate == run.job.result_version and promotion.requested_by == olga
    assert run.notified == ["arno"]
    assert LearningPolicyRun.objects.count() == 1  # beat kept ticking: no second run on the same comments
    assert LiveVersion.objects.get(deployment=deployment).version == live
    assert LiveVersionChange.objects.count() == changes
