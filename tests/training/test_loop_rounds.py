"""`make loop-rounds` on the tiny model: the loop runs unattended with real parts (a Celery
worker and beat on Redis, PostgreSQL) for two rounds of the live version's traffic and the
simulated lead's comments; each round's policy run ends, its candidate is measured on the
test split against the base on the same tasks, and nothing goes live."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.fixtures.worker import _database_url
from training.promotion.evaluation.split_looks import SecondLook

spec = importlib.util.spec_from_file_location(
    "loop_rounds", Path(__file__).parent.parent.parent / "scripts" / "loop_rounds.py"
)
loop_rounds = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = loop_rounds
spec.loader.exec_module(loop_rounds)

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_two_rounds_run_unattended_up_to_an_approver_and_nothing_goes_live(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    from feedback.models import Comment
    from training.learning_policies.models import LearningPolicyRun
    from training.serving.models import LiveVersionChange

    monkeypatch.setenv("DATABASE_URL", _database_url())  # the worker and beat use the test database
    monkeypatch.setenv("PRACTICUM_DATA_DIR", str(tmp_path / "data"))
    args = loop_rounds.main.__globals__["argparse"].Namespace(
        model=tiny_model_dir,
        rounds=2,
        episodes=4,
        min_new_turns=1,
        eval_tasks=2,
        test_episodes=3,
        seed=0,
        round_timeout=300,
        out=tmp_path / "out",
        run="t",
        looks_log=tmp_path / "looks.jsonl",
        second_look="",
        argv=["--rounds", "2"],
    )

    loop_rounds.run(args)

    records = [json.loads(x) for x in (tmp_path / "out" / "runs.jsonl").read_text().splitlines()]
    rounds = [r for r in records if r["kind"] == "round"]
    assert [r["round"] for r in rounds] == [1, 2]
    runs = list(LearningPolicyRun.objects.order_by("pk"))
    assert [r.pk for r in runs] == [r["policy_run"] for r in rounds]
    # Each round learnt from that round's comments only, by the simulated lead.
    assert [r.provenance["comments"] for r in runs] == [
        Comment.objects.filter(trace__metadata__phase=f"loop-t-round{n}").count() for n in (1, 2)
    ]
    for r, run in zip(rounds, runs, strict=True):
        assert run.finished_at is not None and run.outcome in ("requested", "checks_failed"), (run.outcome, run.error)
        assert r["outcome"] == run.outcome and (run.outcome == "requested") == (run.promotion_id is not None)
        # The candidate and the base played the same test tasks.
        assert [e["task"] for e in r["measure"]["episodes"]] == [
            e["task"] for e in next(x for x in records if x["kind"] == "base")["measure"]["episodes"]
        ]
        assert (
            r["test"]["n"] == 3 and r["test"]["gain_interval"][0] <= r["test"]["gain"] <= r["test"]["gain_interval"][1]
        )
    # Each round's candidate measured on the test split is a look, logged before it played.
    looks = [json.loads(x) for x in (tmp_path / "looks.jsonl").read_text().splitlines()]
    assert [(x["family"], x["seeds"], x["run"]) for x in looks] == [
        (f"loop-rounds round {n} (4 episodes a round, fires at 1 turns)", [0], "t") for n in (1, 2)
    ]
    with pytest.raises(SecondLook, match="already measured for 'loop-rounds round 1"):
        loop_rounds.looks_check(args)  # the same rounds and seed again: refused
    # Unattended up to a person: the live pointer was set once, at the start, and never moved.
    assert LiveVersionChange.objects.count() == 1
    assert records[-1] == {"run": "t", "kind": "end", "live": "smollm2-loop-t-base"}

    capsys.readouterr()
    loop_rounds.summary(tmp_path / "out" / "runs.jsonl")
    out = capsys.readouterr().out
    assert out.count("| smollm2-loop-t-base-distill-job") == 2 and "nothing was approved" in out
