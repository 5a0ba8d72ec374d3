"""The tour's summary: base vs candidate per slice over seeds, and the gain paired by episode."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from training.evaluation.seeds import interval_text

spec = importlib.util.spec_from_file_location("tour_demo", Path(__file__).parent.parent / "scripts" / "tour_demo.py")
tour_demo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tour_demo)


def _measure(successes: list[bool], tasks: list[str], collateral: float | None = 0.0) -> dict:
    return {
        "graded": len(successes),
        "success_rate": sum(successes) / len(successes),
        "collateral_rate": collateral,
        "per_episode": [{"task": t, "success": s} for t, s in zip(tasks, successes, strict=True)],
    }


def test_the_paired_gain_pairs_the_same_task_of_the_same_seed_only():
    seeds = [
        {
            "base": {"test": _measure([True, False, False], ["a", "b", "c"])},
            "candidate": {"test": _measure([True, True, False], ["a", "b", "c"])},
        },
        {
            "base": {"test": _measure([False, False, True], ["d", "e", "f"])},
            "candidate": {"test": _measure([True, True, True], ["d", "e", "x"])},
        },  # "x": not f, left out
    ]
    text = "\n".join(tour_demo.summary_lines(seeds, ["test"]))

    assert "test (2 seeds, 3 graded episodes each" in text
    assert f"gain paired by episode over 5 (seed, task) pairs  {interval_text([0, 1, 0, 1, 1])}" in text
    assert f"collateral changes  base {interval_text([0.0, 0.0])}" in text


def test_a_summary_rebuilt_from_traces_has_no_collateral_line():
    seeds = [{"base": {"test": _measure([True], ["a"], None)}, "candidate": {"test": _measure([False], ["a"], None)}}]
    text = "\n".join(tour_demo.summary_lines(seeds, ["test"]))
    assert "collateral" not in text and "success             base 1.000  candidate 0.000" in text


def _store_runs(tmp_path, runs):
    """Traces of tour runs as the gateway stores them: (run, version or None, split, fresh
    seed, {episode index: grader rating}), one minute apart in this order."""
    import datetime as dt

    from django.utils import timezone

    from feedback.models import CustomerFeedback
    from tests.factories import DeploymentFactory, TraceFactory
    from training.models import BaseModel, ModelVersion

    deployment = DeploymentFactory(name="support-bot")
    base = BaseModel.objects.create(name="smol", path=str(tmp_path))
    versions = {
        name: ModelVersion.objects.create(name=name, base_model=base, kind=kind, path=str(tmp_path))
        for name, kind in (("smol", "base"), ("smol-sft-job1", "lora"), ("smol-sft-job2", "lora"))
    }
    started = timezone.now()
    for n, (run, version, split, fresh_seed, ratings) in enumerate(runs):
        for i, rating in ratings.items():
            metadata = {"split": split, "task_id": f"refund-{split}-{i}"}
            if fresh_seed is not None:
                metadata["fresh_seed"] = str(fresh_seed)
            trace = TraceFactory(
                deployment=deployment,
                model_version=versions[version] if version else None,
                external_id=f"demo-{run}-{split}-{i:03d}",
                metadata=metadata,
                started_at=started + dt.timedelta(minutes=n, seconds=i),
            )
            CustomerFeedback.objects.create(
                deployment=deployment, trace=trace, customer_ref="grader", rating_kind="score", rating=rating
            )


@pytest.mark.django_db
def test_measurements_are_rebuilt_from_the_traces_and_the_graders_feedback(tmp_path):
    # The base on test and fresh, then the candidate on both (one seed), in that order.
    _store_runs(
        tmp_path,
        [
            ("r1", "smol", "test", None, {0: 5, 1: 1}),
            ("r2", "smol", "fresh", 2, {0: 1, 1: 1}),
            ("r3", "smol-sft-job1", "test", None, {0: 5, 1: 5}),
            ("r4", "smol-sft-job1", "fresh", 2, {0: 1, 1: 5}),
        ],
    )

    per_seed, slices = tour_demo.per_seed_from_db("support-bot")

    assert slices == ["test", "fresh-2"] and len(per_seed) == 1
    assert per_seed[0]["base"]["test"]["success_rate"] == 0.5 and per_seed[0]["candidate"]["test"]["success_rate"] == 1
    assert tour_demo.paired_gains([per_seed[0]["base"]["fresh-2"]], [per_seed[0]["candidate"]["fresh-2"]]) == [0.0, 1.0]


@pytest.mark.django_db
def test_a_stopped_and_restarted_tour_pairs_each_candidate_with_the_base_run_just_before_it(tmp_path):
    _store_runs(
        tmp_path,
        [
            ("r1", "smol", "test", None, {0: 1, 1: 1}),  # a first try, stopped before its candidate
            ("r2", None, "test", None, {0: 5}),  # a trace no version served: left out
            ("r3", "smol", "test", None, {0: 5, 1: 1, 2: 1}),
            ("r4", "smol", "fresh", 1, {0: 1}),
            ("r5", "smol", "fresh", 2, {0: 5}),
            ("r6", "smol-sft-job1", "test", None, {0: 5, 2: 5}),  # episode 1 lost when it stopped
            ("r7", "smol-sft-job1", "fresh", 1, {0: 5}),
            ("r8", "smol-sft-job1", "fresh", 2, {0: 1}),
        ],
    )

    per_seed, slices = tour_demo.per_seed_from_db("support-bot")

    assert slices == ["test", "fresh-1", "fresh-2"] and len(per_seed) == 1
    row = per_seed[0]
    assert row["base"]["test"]["graded"] == 3 and row["candidate"]["test"]["version"] == "smol-sft-job1"
    # Episodes 0 and 2 pair up by index; episode 1 has no candidate run.
    assert tour_demo.paired_gains([row["base"]["test"]], [row["candidate"]["test"]]) == [0.0, 1.0]
    assert tour_demo.paired_gains([row["base"]["fresh-1"]], [row["candidate"]["fresh-1"]]) == [1.0]
    assert tour_demo.paired_gains([row["base"]["fresh-2"]], [row["candidate"]["fresh-2"]]) == [-1.0]


@pytest.mark.django_db
def test_traces_that_name_no_fresh_seed_are_placed_by_their_task_and_a_base_run_pairs_once(tmp_path):
    from feedback.models import Trace
    from training.environments.support_desk import SupportDesk

    desk = SupportDesk()
    slice_1, slice_2 = desk.tasks_fresh(seed=1)[0].id, desk.tasks_fresh(seed=2)[0].id
    _store_runs(
        tmp_path,
        [
            ("r1", "smol", "fresh", None, {0: 1}),
            ("r2", "smol", "fresh", None, {0: 5}),
            ("r3", "smol-sft-job1", "fresh", None, {0: 5}),
            ("r4", "smol-sft-job1", "fresh", None, {0: 1}),
            ("r5", "smol-sft-job2", "fresh", None, {0: 5}),  # a second candidate, no base run of its own
        ],
    )
    # As logged before traces named their slice: only the task tells them apart.
    for run, task_id in (("r1", slice_1), ("r2", slice_2), ("r3", slice_1), ("r4", slice_2), ("r5", slice_1)):
        trace = Trace.objects.get(external_id__startswith=f"demo-{run}-")
        trace.metadata = {"split": "fresh", "task_id": task_id}
        trace.save(update_fields=["metadata"])

    per_seed, slices = tour_demo.per_seed_from_db("support-bot")

    assert slices == ["fresh-1", "fresh-2"] and len(per_seed) == 1
    row = per_seed[0]
    assert tour_demo.paired_gains([row["base"]["fresh-1"]], [row["candidate"]["fresh-1"]]) == [1.0]
    assert tour_demo.paired_gains([row["base"]["fresh-2"]], [row["candidate"]["fresh-2"]]) == [-1.0]
