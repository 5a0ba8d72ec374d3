"""The tour's summary: base vs candidate per slice over seeds, and the gain paired by episode."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from training.promotion.evaluation.paired_runs import paired_gains, slice_summaries
from training.promotion.evaluation.seeds import interval_text

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


def test_the_summary_prints_violations_the_task_bootstrap_gain_and_each_kind():
    def measure(successes, kinds, violations):
        return {
            "graded": len(successes),
            "success_rate": sum(successes) / len(successes),
            "collateral_rate": 0.0,
            "violation_rate": sum(bool(v) for v in violations) / len(violations),
            "per_episode": [
                {"index": str(i), "task": f"t{i}", "kind": k, "success": s, "violations": v}
                for i, (s, k, v) in enumerate(zip(successes, kinds, violations, strict=True))
            ],
        }

    kinds = ["refundable_recent", "refundable_recent", "late_near_line", "late_near_line"]
    seeds = [
        {
            "base": {"test": measure([False, False, True, True], kinds, [0, 0, 0, 0])},
            # "Refund every delivered order": recent ones right, late ones refunded.
            "candidate": {"test": measure([True, True, False, False], kinds, [0, 0, 2, 2])},
        }
    ]
    text = "\n".join(tour_demo.summary_lines(seeds, ["test"]))

    assert "policy violations   base 0.000  candidate 0.500" in text
    # Two kinds, one gained on both tasks and one lost on both: every stratified resample
    # keeps two of each, so the gain is 0 with no spread.
    assert "gain +0.000 [+0.000, +0.000] (task bootstrap: 4 tasks in 2 kinds x 1 seed)" in text
    assert re.search(r"delivered at most 21 days ago \(refund\) +0/2 → 2/2 +violations 0/2 → 0/2", text)
    assert re.search(r"delivered 31-40 days ago \(refuse\) +2/2 → 0/2 +violations 0/2 → 2/2", text)


def test_a_summary_without_collateral_figures_has_no_collateral_line():
    seeds = [{"base": {"test": _measure([True], ["a"], None)}, "candidate": {"test": _measure([False], ["a"], None)}}]
    text = "\n".join(tour_demo.summary_lines(seeds, ["test"]))
    assert "collateral" not in text and "success             base 1.000  candidate 0.000" in text


def _store_runs(tmp_path, runs):
    """Traces of tour runs as the gateway stores them: (run, version or None, split, fresh
    seed, {episode index: the grader's rating 1-5, stored as its grade}), one minute apart in
    this order."""
    import datetime as dt

    from django.utils import timezone

    from feedback.models import Grade
    from tests.factories import DeploymentFactory, TraceFactory
    from training.serving.models import BaseModel, ModelVersion

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
            Grade.objects.create(
                deployment=deployment,
                trace=trace,
                outcome="success" if rating == 5 else "failure",
                score=(rating - 1) / 4,
                source="support-desk",
            )


def measured_runs(**kwargs):
    from webapp.site.selectors_measurements import measured_runs

    return measured_runs(**kwargs)


@pytest.mark.django_db
def test_measurements_are_rebuilt_from_the_traces_and_their_grades(tmp_path):
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

    per_seed, slices = measured_runs(deployment="support-bot")

    assert slices == ["test", "fresh-2"] and len(per_seed) == 1
    assert per_seed[0]["base"]["test"]["success_rate"] == 0.5 and per_seed[0]["candidate"]["test"]["success_rate"] == 1
    assert paired_gains([per_seed[0]["base"]["fresh-2"]], [per_seed[0]["candidate"]["fresh-2"]]) == [0.0, 1.0]


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

    per_seed, slices = measured_runs(deployment="support-bot")

    assert slices == ["test", "fresh-1", "fresh-2"] and len(per_seed) == 1
    row = per_seed[0]
    assert row["base"]["test"]["graded"] == 3 and row["candidate"]["test"]["version"] == "smol-sft-job1"
    # Episodes 0 and 2 pair up by index; episode 1 has no candidate run.
    assert paired_gains([row["base"]["test"]], [row["candidate"]["test"]]) == [0.0, 1.0]
    assert paired_gains([row["base"]["fresh-1"]], [row["candidate"]["fresh-1"]]) == [1.0]
    assert paired_gains([row["base"]["fresh-2"]], [row["candidate"]["fresh-2"]]) == [-1.0]


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

    per_seed, slices = measured_runs(deployment="support-bot")

    assert slices == ["fresh-1", "fresh-2"] and len(per_seed) == 1
    row = per_seed[0]
    assert paired_gains([row["base"]["fresh-1"]], [row["candidate"]["fresh-1"]]) == [1.0]
    assert paired_gains([row["base"]["fresh-2"]], [row["candidate"]["fresh-2"]]) == [-1.0]


@pytest.mark.django_db
def test_collateral_changes_are_counted_from_the_logged_conversation_when_the_harness_reports_none(tmp_path):
    from feedback.models import Message, Trace
    from training.environments import Completion, episode_run
    from training.environments.support_desk import SupportDesk

    desk = SupportDesk()
    tasks = desk.tasks_for(split="test", graded=True)[:4]
    _store_runs(
        tmp_path,
        [("r1", "smol", "test", None, dict.fromkeys(range(4), 1)), ("r2", "smol-sft-job1", "test", None, {0: 1, 1: 1})],
    )

    def refund(order_id):
        call = {"id": "c0", "type": "function", "function": {"name": "issue_refund", "arguments": ""}}
        call["function"]["arguments"] = json.dumps({"order_id": order_id})
        return Completion(message={"content": "", "tool_calls": [call]}, tokens=1)

    # The base refunds the next customer's order on episodes 0 and 1, its own on 2 and 3;
    # the candidate refunds its own on both of its episodes.
    plays = {("r1", i): tasks[(i + 1) % 4 if i < 2 else i].hidden["order_id"] for i in range(4)} | {
        ("r2", i): tasks[i].hidden["order_id"] for i in range(2)
    }
    for (run, i), order_id in plays.items():
        turns = iter([refund(order_id), Completion(message={"content": "Done."}, tokens=1)])
        episode = episode_run(desk, tasks[i], lambda *_a, turns=turns: next(turns))
        trace = Trace.objects.get(external_id=f"demo-{run}-test-{i:03d}")
        trace.environment, trace.metadata = "support-desk", {**trace.metadata, "task_id": tasks[i].id}
        trace.save(update_fields=["environment", "metadata"])
        for position, m in enumerate(episode.messages):
            Message.objects.create(
                trace=trace,
                position=position,
                role=m["role"],
                content=m.get("content") or "",
                tool_calls=m.get("tool_calls") or [],
                tool_call_id=m.get("tool_call_id", ""),
                raw={},
            )

    per_seed, _slices = measured_runs(deployment="support-bot")
    (summary,) = slice_summaries(per_seed, ["test"])

    base, candidate = per_seed[0]["base"]["test"], per_seed[0]["candidate"]["test"]
    assert (base["collateral_rate"], base["replayed"]) == (0.5, 4)
    assert [e["collateral"] for e in base["per_episode"]] == [True, True, False, False]
    assert candidate["collateral_rate"] == 0.0 and summary.base_collateral[0] == 0.5
    assert "collateral changes  base 0.500  candidate 0.000" in "\n".join(tour_demo.summary_lines(per_seed, ["test"]))
    # A refund of the customer's own order that the policy forbids is a policy violation,
    # recomputed from the conversation too; each episode names its task's kind.
    forbidden = [not t.hidden["refund"] for t in tasks]
    assert [e["violations"] for e in candidate["per_episode"]] == forbidden[:2]
    assert [e["violations"] for e in base["per_episode"]] == [False, False, *forbidden[2:]]
    assert candidate["violation_rate"] == sum(forbidden[:2]) / 2
    assert [e["kind"] for e in base["per_episode"]] == [t.hidden["kind"] for t in tasks]


@pytest.mark.django_db
def test_episodes_of_unknown_tasks_are_left_out_of_the_collateral_rate(tmp_path):
    _store_runs(tmp_path, [("r1", "smol", "test", None, {0: 5}), ("r2", "smol-sft-job1", "test", None, {0: 5})])

    per_seed, _slices = measured_runs(deployment="support-bot")

    assert per_seed[0]["base"]["test"]["replayed"] == 0 and per_seed[0]["base"]["test"]["collateral_rate"] is None
    assert slice_summaries(per_seed, ["test"])[0].base_collateral is None


def test_seeds_of_several_result_files_are_summarised_together_and_a_repeated_seed_is_refused(tmp_path):
    def result(seed, base, cand):
        return {"seeds": [{"seed": seed, "base": {"test": base}, "candidate": {"test": cand}}]}

    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps(result(0, _measure([False, True], ["a", "b"]), _measure([True, True], ["a", "b"]))))
    second.write_text(json.dumps(result(1, _measure([False, False], ["c", "d"]), _measure([True, False], ["c", "d"]))))

    per_seed, slices = tour_demo.per_seed_from_results([second, first])

    assert [r["seed"] for r in per_seed] == [0, 1] and slices == ["test"]
    assert slice_summaries(per_seed, slices)[0].gain[0] == 0.5
    with pytest.raises(SystemExit, match="seed 0"):
        tour_demo.per_seed_from_results([first, first])


@pytest.mark.django_db
def test_the_overview_shows_base_vs_candidate_over_the_seeds_with_intervals(tmp_path, client):
    from feedback.models import Trace
    from tests.factories import user_with_role
    from training.templatetags.promotion_tags import interval

    _store_runs(
        tmp_path,
        [
            ("r1", "smol", "test", None, {0: 1, 1: 1, 2: 5}),
            ("r2", "smol-sft-job1", "test", None, {0: 5, 1: 1, 2: 5}),
            ("r3", "smol", "test", None, {0: 1, 1: 5, 2: 1}),
            ("r4", "smol-sft-job2", "test", None, {0: 5, 1: 5, 2: 5}),
            ("r5", "smol", "fresh", "<b>7</b>", {0: 5}),
            ("r6", "smol-sft-job2", "fresh", "<b>7</b>", {0: 1}),
        ],
    )
    assert Trace.objects.filter(metadata__fresh_seed="<b>7</b>").count() == 2
    client.force_login(user_with_role("operator"))

    page = client.get("/overview/").content.decode()

    row = page[page.index('data-slice="test"') : page.index("</tr>", page.index('data-slice="test"'))]

    def cell(name):
        return re.search(rf'class="num {name}">(.*?)</td>', row).group(1)

    assert "smol-sft-job1, smol-sft-job2" in row and cell("seeds").startswith("2 <span")
    assert cell("base-success") == "0.333"  # one in three on both seeds: no spread, no interval
    assert cell("candidate-success") == interval(_clamped(mean_interval_of([2 / 3, 1.0])))
    assert cell("gain") == interval(mean_interval_of([1 / 3, 2 / 3]))
    assert cell("paired-gain").startswith(interval(mean_interval_of([1, 0, 0, 1, 0, 1])))
    # Resampling the 3 tasks and the 2 seeds: the same mean, a wider interval.
    assert cell("task-gain").startswith("0.500 [") and "(3 tasks \u00d7 2)" in cell("task-gain")
    assert cell("base-collateral") == "—"  # no conversation stored: nothing to replay
    assert "fresh-&lt;b&gt;7&lt;/b&gt;" in page and "<b>7</b>" not in page


def _clamped(interval):
    mean, low, high = interval
    return mean, max(0.0, low), min(1.0, high)


def mean_interval_of(values):
    from training.promotion.evaluation.seeds import mean_interval

    return mean_interval(values)


@pytest.mark.django_db
def test_a_cap_that_cuts_into_a_run_leaves_that_run_out_whole_and_odd_seeds_do_not_break_the_page(tmp_path, client):
    from tests.factories import user_with_role

    _store_runs(
        tmp_path,
        [
            ("r1", "smol", "test", None, {0: 1, 1: 1, 2: 1, 3: 5}),
            ("r2", "smol-sft-job1", "test", None, {0: 5, 1: 5, 2: 5, 3: 5}),
            ("r3", "smol", "fresh", "²", {0: 5}),  # str.isdigit() says yes; int() says no
            ("r4", "smol-sft-job1", "fresh", "²", {0: 5}),
        ],
    )

    assert measured_runs(deployment="support-bot", max_traces=100)[0][0]["base"]["test"]["graded"] == 4
    per_seed, slices = measured_runs(deployment="support-bot", max_traces=10)  # all ten fit
    assert "test" in slices and per_seed[0]["base"]["test"]["success_rate"] == 0.25
    # Eight from the newest: r4, r3, r2 and two of r1's four, whose base would read 0.0.
    per_seed, slices = measured_runs(deployment="support-bot", max_traces=8)
    assert "test" not in slices  # r1 cut: left out whole, so r2 has no base to pair with
    client.force_login(user_with_role("operator"))
    assert client.get("/overview/").status_code == 200
