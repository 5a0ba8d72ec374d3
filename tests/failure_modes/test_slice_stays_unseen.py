"""An evaluation slice is a test the candidate never saw: no training set trains on its
traces once it exists, and a candidate whose own training (or an ancestor's) took one of
them is refused an evaluation on it."""

from __future__ import annotations

import pytest
from django.utils import timezone

from tests.failure_modes.test_cluster_names_and_flags import noted  # noqa: F401
from tests.failure_modes.test_feed_the_loop import modes  # noqa: F401
from tests.promotion.conftest import make_adapter_folder
from tests.training.policies import finish_job, policy, world  # noqa: F401
from training.learning_policies.tick import learning_policies_tick
from training.models import TrainingItem, TrainingJob, TrainingSplit
from training.promotion.models import Evaluation
from training.promotion.services.evaluation_items import EvaluationError
from training.services.evaluation_slices import evaluation_slice_from_failure_cluster
from training.services.feedback_sets import training_set_from_feedback
from training.services.jobs import training_job_create
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db


def _slice_traces(built) -> set[int]:
    return set(TrainingItem.objects.filter(training_set=built).values_list("trace_id", flat=True))


def _trained_traces(training_set) -> set[int]:
    return set(
        TrainingItem.objects.filter(training_set=training_set, split=TrainingSplit.TRAIN).values_list(
            "trace_id", flat=True
        )
    )


def test_a_policy_evaluated_on_a_slice_does_not_train_on_the_slices_turns(modes, world):  # noqa: F811
    """The policy's new feedback is the very comments the failure mode was made of: its set
    holds those turns out, so the candidate it trains meets them first in the evaluation."""
    built, _ = evaluation_slice_from_failure_cluster(cluster=modes["tracking"], user=world["olga"])
    assert modes["run"].deployment == world["deployment"]  # the policy's feedback is the slice's
    p = policy(world, eval_training_set=built, min_new_turns=1)
    learning_policies_tick()
    run = p.runs.get()
    assert run.job_id is not None, run.error
    trained = _trained_traces(run.training_set)
    assert trained, "the other feedback still trains"
    assert not trained & _slice_traces(built)
    held = TrainingItem.objects.filter(training_set=run.training_set, trace_id__in=_slice_traces(built))
    assert held.exists() and {it.split for it in held} == {TrainingSplit.HELDOUT}
    assert run.training_set.selection["held_out_for_evaluation_slices"] == held.count()


def test_a_training_set_built_after_the_slice_holds_its_traces_out(modes):  # noqa: F811
    built, _ = evaluation_slice_from_failure_cluster(cluster=modes["tracking"], user=None)
    everything = training_set_from_feedback(name="everything", filters={}, heldout_fraction=0.0)
    on_slice = TrainingItem.objects.filter(training_set=everything, trace_id__in=_slice_traces(built))
    assert on_slice.count() == built.item_count and {it.split for it in on_slice} == {TrainingSplit.HELDOUT}
    assert _trained_traces(everything), "the rest still trains"


def _candidate(world, name, *, parent=None):  # noqa: F811
    from training.serving.services import model_version_create

    return model_version_create(
        name=name,
        base_model=world["base"],
        kind="lora",
        path=make_adapter_folder(world["tmp"] / name),
        parent=parent or world["base_version"],
    )


def test_a_candidate_trained_on_the_slices_turns_is_not_evaluated_on_it(modes, world):  # noqa: F811
    """A set built before the slice took its turns as training items: the candidate trained on
    it, and one trained from that candidate, saw the test; one that did not may take it."""
    from training.promotion.services.evaluation import evaluation_create

    earlier = training_set_from_feedback(name="before-the-slice", filters={}, heldout_fraction=0.0)
    job = training_job_create(
        kind="distill", config={"steps": 2}, base_version=world["base_version"], training_set=earlier, enqueue=False
    )
    saw = _candidate(world, "saw-it")
    TrainingJob.objects.filter(pk=job.pk).update(
        status=WorkStatus.FINISHED, result_version=saw, finished_at=timezone.now()
    )
    child = _candidate(world, "child-of-saw-it", parent=saw)
    built, _ = evaluation_slice_from_failure_cluster(cluster=modes["tracking"], user=None)
    assert _trained_traces(earlier) & _slice_traces(built)

    for candidate in (saw, child):
        with pytest.raises(EvaluationError) as refused:
            evaluation_create(candidate=candidate, deployment=world["deployment"], training_set=built)
        field, reason = refused.value.errors[0]
        assert field == "training_set" and "before-the-slice" in reason and "trained on" in reason
    assert not Evaluation.objects.exists()

    fresh = _candidate(world, "never-saw-it")
    evaluation = evaluation_create(candidate=fresh, deployment=world["deployment"], training_set=built)
    assert evaluation.total == built.heldout_count


def test_the_slice_is_judged_on_the_mistake_its_notes_name(modes, world):  # noqa: F811
    """A commented turn has no judge's rubric: evaluated under the general one alone, a
    candidate that leaves the tracking link out again could still win. Each item's rubric holds
    the reviewers' words, and the evaluation scores both answers under it."""
    from training.promotion.models import EvaluationItem
    from training.promotion.services.evaluation import evaluation_create

    built, _ = evaluation_slice_from_failure_cluster(cluster=modes["tracking"], user=None)
    for item in TrainingItem.objects.filter(training_set=built):
        criteria = [c["criterion"] for c in item.rubric["criteria"]]
        assert any(item.feedback in c for c in criteria), criteria  # the comment is the note
        assert all(c["weight"] in (1, 2, 3) for c in item.rubric["criteria"])
    evaluation = evaluation_create(
        candidate=_candidate(world, "fresh"), deployment=world["deployment"], training_set=built
    )
    for item in EvaluationItem.objects.filter(evaluation=evaluation):
        assert any("tracking" in c["criterion"].lower() for c in item.rubric["criteria"]), item.rubric


def test_a_failure_mode_replaced_while_its_button_is_pressed_is_refused_not_a_crash(modes):  # noqa: F811
    """A run found running restarts and deletes its clusters: the page a person pressed the
    button on still names the old one. Both services answer on `cluster`, nothing is stored."""
    from feedback.models import AnnotationQueue, FailureCluster
    from feedback.services.queues import queue_from_failure_cluster
    from training.models import TrainingSet
    from training.services.training_sets import TrainingSetError
    from webapp.kernel.chat_format import FieldError

    stale = modes["tracking"]
    FailureCluster.objects.filter(pk=stale.pk).delete()
    with pytest.raises(FieldError) as refused:
        queue_from_failure_cluster(cluster=stale, created_by=None)
    assert refused.value.field == "cluster" and "replaced" in refused.value.reason
    with pytest.raises(TrainingSetError) as refused:
        evaluation_slice_from_failure_cluster(cluster=stale, user=None)
    assert refused.value.errors[0][0] == "cluster" and "replaced" in refused.value.errors[0][1]
    assert not AnnotationQueue.objects.exists() and not TrainingSet.objects.exists()


def test_a_set_from_the_failure_modes_queue_after_its_slice_says_why_it_trains_nothing(modes, world):  # noqa: F811
    """The queue holds the very traces the slice tests: a set built from it holds them all out,
    and a job on it says that is why it has nothing to train on."""
    from feedback.services.queues import queue_from_failure_cluster
    from training.services.jobs import JobError

    queue, _ = queue_from_failure_cluster(cluster=modes["tracking"], created_by=None)
    built, _ = evaluation_slice_from_failure_cluster(cluster=modes["tracking"], user=None)
    from_queue = training_set_from_feedback(name="from-the-queue", queue_id=queue.pk, heldout_fraction=0.0)
    assert from_queue.train_count == 0 and from_queue.selection["held_out_for_evaluation_slices"] == built.item_count
    with pytest.raises(JobError) as refused:
        training_job_create(
            kind="distill", config={"steps": 2}, base_version=world["base_version"], training_set=from_queue
        )
    field, reason = refused.value.errors[0]
    assert field == "training_set" and "evaluation slice" in reason, reason


def test_a_deployments_api_key_makes_neither_queue_nor_slice(modes, client):  # noqa: F811
    """The buttons are a person's: a deployment's key, whatever its scopes, is refused."""
    from feedback.models import AnnotationQueue, ApiKeyScope
    from feedback.services.api_keys import api_key_create
    from training.models import TrainingSet

    key = api_key_create(deployment=modes["run"].deployment, scopes=list(ApiKeyScope.values))
    for path in ("queue", "evaluation-slice"):
        answer = client.post(
            f"/api/v1/failure-modes/clusters/{modes['tracking'].pk}/{path}",
            HTTP_AUTHORIZATION=f"Bearer {key.plaintext}",
        )
        assert answer.status_code == 403, (path, answer.content)
    assert not AnnotationQueue.objects.exists() and not TrainingSet.objects.exists()
