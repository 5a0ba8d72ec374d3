"""Looks at the test split: each measurement of a recipe family is logged, and a second look
at a family needs its reason."""

from __future__ import annotations

import pytest

from training.promotion.evaluation.split_looks import SecondLook, split_look_check, split_look_record, split_looks


def test_each_look_is_logged_and_a_second_look_needs_a_reason(tmp_path):
    log = tmp_path / "looks.jsonl"
    split_look_check(family="tour-sft", path=log)  # never looked: fine
    first = split_look_record(
        family="tour-sft", script="scripts/tour_demo.py", argv=["--seeds", "3"], seeds=[0, 1, 2], path=log
    )
    assert (first["look"], first["seeds"], first["argv"]) == (1, [0, 1, 2], ["--seeds", "3"]) and first["at"]
    with pytest.raises(SecondLook, match="already measured for 'tour-sft'"):
        split_look_check(family="tour-sft", path=log)
    split_look_check(family="desk-cf-near", path=log)  # another family: fine
    split_look_check(family="tour-sft", seeds=[3], path=log)  # another seed of the family: fine
    with pytest.raises(SecondLook):
        split_look_check(family="tour-sft", seeds=[2, 3], path=log)
    split_look_check(family="tour-sft", reason="the server crashed in seed 1", path=log)
    second = split_look_record(
        family="tour-sft", script="scripts/tour_demo.py", argv=[], seeds=[1], reason="the server crashed", path=log
    )
    assert second["look"] == 2 and second["reason"] == "the server crashed"
    assert [look["look"] for look in split_looks(log)] == [1, 2]


def test_of_two_runs_that_passed_the_check_the_second_is_refused_as_it_records(tmp_path):
    """Two processes of one run check hours before they measure: the check that counts is the
    one made with the record, under the log's lock."""
    from training.promotion.evaluation.split_looks import split_look_take

    log = tmp_path / "looks.jsonl"
    split_look_check(family="lfc-words", seeds=[1], path=log)  # process A, at its start
    split_look_check(family="lfc-words", seeds=[1], path=log)  # process B, at its start
    taken = split_look_take(
        family="lfc-words", script="s", argv=["run"], seeds=[1], path=log, run="r1", commit="abc1234"
    )
    assert (taken["look"], taken["run"], taken["commit"]) == (1, "r1", "abc1234") and "reason" not in taken
    with pytest.raises(SecondLook, match="already measured for 'lfc-words'"):
        split_look_take(family="lfc-words", script="s", argv=["run"], seeds=[1], path=log, run="r2")
    assert [x["run"] for x in split_looks(log)] == ["r1"]  # the refused look is not logged
    other = split_look_take(family="lfc-words", script="s", argv=[], seeds=[2], reason="not needed", path=log)
    assert other["look"] == 2 and "reason" not in other  # a first look of its seed explains nothing
    # A line another process is still writing (no newline yet) is not read as a look.
    with log.open("a") as f:
        f.write('{"family": "lfc-words", "seeds": [3')
    assert len(split_looks(log)) == 2
