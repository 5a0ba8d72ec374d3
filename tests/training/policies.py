"""A deployment serving a base version, an operator and an approver, and the feedback and
finished work the learning policy tests build on (the `world` fixture is in conftest)."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from unittest import mock

import pytest
from django.utils import timezone

from feedback.models import Comment
from tests.factories import DeploymentFactory, MessageFactory, TraceFactory, user_with_role
from tests.promotion.conftest import make_adapter_folder
from training.learning_policies.models import LearningPolicyRun
from training.learning_policies.services import learning_policy_create
from training.models import TrainingJob
from training.promotion.models import Evaluation
from training.services.training_sets import training_set_from_tasks
from webapp.kernel.work import WorkStatus

TASKS = [{"prompt": f"Say something about order A{i}.", "reference": "e", "grader": "contains"} for i in range(12)]


@pytest.fixture
def world(request, tmp_path, settings):
    """A deployment serving a base version, two people and an evaluation set. A test may have
    the base go live some days back (`@pytest.mark.parametrize("world", [{"live_days_ago": 8}],
    indirect=True)`): the pointer's trail is append-only, so it cannot be backdated after."""
    from training.serving.services import base_model_register, live_version_set

    settings.EVAL_GENERATOR = "local"
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    base, base_version = base_model_register(name="smol", path=tmp_path / "base")
    deployment = DeploymentFactory(name="support-bot")
    days = getattr(request, "param", {}).get("live_days_ago", 0)
    then = timezone.now() - timedelta(days=days)
    with mock.patch.object(timezone, "now", return_value=then) if days else contextlib.nullcontext():
        live_version_set(deployment=deployment, version=base_version)
    olga = user_with_role("operator", "olga")
    arno = user_with_role("approver", "arno", email="arno@example.com")
    eval_set = training_set_from_tasks(name="orders", tasks=TASKS, heldout_fraction=0.25)
    return {
        "deployment": deployment,
        "base": base,
        "base_version": base_version,
        "olga": olga,
        "arno": arno,
        "eval_set": eval_set,
        "tmp": tmp_path,
    }


def commented_turns(deployment, n: int, *, start: int = 0) -> list[Comment]:
    """`n` conversations, each with one commented assistant turn."""
    comments = []
    for i in range(start, start + n):
        trace = TraceFactory(deployment=deployment, external_id=f"conv-{i}")
        MessageFactory(trace=trace, position=0, role="user", content=f"Where is order A{i}?")
        turn = MessageFactory(trace=trace, position=1, role="assistant", content="No idea.")
        comments.append(Comment.objects.create(trace=trace, message=turn, body=f"Look order A{i} up first."))
    return comments


def policy(world, **values):
    defaults = {
        "name": "fix-lookups",
        "signal": "comments",
        "min_new_turns": 3,
        "job_kind": "distill",
        "job_config": {"steps": 2},
        "eval_training_set": world["eval_set"],
        # Evaluated on that set. A held-out fraction of a few turns splits them by their keys'
        # hash, which holds database ids: in some orders of the suite all of them were held out
        # and the job had nothing to train on. Tests of the split set it themselves.
        "heldout_fraction": 0.0,
        "min_win_rate": 0.6,
        "min_win_rate_ci_low": 0.5,
        "notify_user": world["arno"],
    }
    return learning_policy_create(deployment=world["deployment"], user=world["olga"], **(defaults | values))


def finish_job(run: LearningPolicyRun, world, *, name: str = "smol-v1"):
    """What a training worker leaves behind: the job finished with a candidate built from live."""
    from training.serving.services import model_version_create

    candidate = model_version_create(
        name=name,
        base_model=world["base"],
        kind="lora",
        path=make_adapter_folder(world["tmp"] / name),
        parent=world["base_version"],
    )
    TrainingJob.objects.filter(pk=run.job_id).update(
        status=WorkStatus.FINISHED, result_version=candidate, finished_at=timezone.now()
    )
    return candidate


def finish_evaluation(run: LearningPolicyRun, *, win_rate: float, ci_low: float, n: int = 3) -> None:
    Evaluation.objects.filter(pk=run.evaluation_id).update(
        status=WorkStatus.FINISHED,
        finished_at=timezone.now(),
        done=n,
        summary={"comparison": {"win_rate": win_rate, "ci_low": ci_low, "ci_high": 1.0, "n": n}},
    )
