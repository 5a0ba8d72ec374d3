"""The records sandbox: each episode has its own copy of the table, the source is never
changed, refusals are tool errors, and the same final rows always get the same grade."""

from __future__ import annotations

import pytest

from training.environments import ToolError
from training.environments.records import (
    FieldSpec,
    RecordTable,
    records_grade,
    records_lookup,
    records_state_new,
    records_update,
)


def table() -> RecordTable:
    return RecordTable(
        name="ticket",
        key="ticket_id",
        rows=(
            {"ticket_id": "T1", "state": "open", "priority": 2, "tags": ["a"]},
            {"ticket_id": "T2", "state": "open", "priority": 1, "tags": []},
        ),
        writable={
            "state": FieldSpec(types=(str,), choices=("open", "closed")),
            "priority": FieldSpec(types=(int,), minimum=1, maximum=3),
        },
    )


def test_parallel_episodes_do_not_see_each_others_changes_and_the_source_never_changes():
    source = table()
    first, second = records_state_new(table=source), records_state_new(table=source)
    records_update(state=first, key="T1", values={"state": "closed", "priority": 3})
    looked = records_lookup(state=first, key="T1")
    looked["tags"].append("mutated by the caller")  # a lookup hands out a copy

    assert records_lookup(state=first, key="T1") == {"ticket_id": "T1", "state": "closed", "priority": 3, "tags": ["a"]}
    assert records_lookup(state=second, key="T1") == {"ticket_id": "T1", "state": "open", "priority": 2, "tags": ["a"]}
    assert source.row("T1") == {"ticket_id": "T1", "state": "open", "priority": 2, "tags": ["a"]}
    assert records_state_new(table=source).rows["T1"]["state"] == "open"
    with pytest.raises(TypeError):
        source.rows[0]["state"] = "closed"  # the source rows are read-only mappings
    assert first.changes == [
        {"key": "T1", "before": {"state": "open", "priority": 2}, "after": {"state": "closed", "priority": 3}}
    ]


@pytest.mark.parametrize(
    ("key", "values", "message"),
    [
        ("T9", {"state": "closed"}, 'no ticket with ticket_id "T9"'),
        ("", {"state": "closed"}, "ticket_id must be a non-empty string"),
        ("T1", {"colour": "red"}, "unknown field 'colour'; the fields are: priority, state, tags, ticket_id"),
        ("T1", {"tags": ["x"]}, "field 'tags' cannot be changed"),
        ("T1", {"state": "deleted"}, 'state must be one of "open", "closed"'),
        ("T1", {"priority": "high"}, 'priority must be a number, not "high"'),
        ("T1", {"priority": True}, "priority must be a number, not a boolean"),
        ("T1", {"priority": 7}, "priority must be at most 3"),
        ("T1", {}, "nothing to change"),
    ],
)
def test_refusals_are_tool_errors_and_change_nothing(key, values, message):
    state = records_state_new(table=table())
    with pytest.raises(ToolError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        records_update(state=state, key=key, values=values)
    assert state.rows == table().rows_copy() and state.changes == []


def test_an_update_with_one_bad_value_writes_nothing():
    state = records_state_new(table=table())
    with pytest.raises(ToolError):
        records_update(state=state, key="T1", values={"state": "closed", "priority": 9})
    assert state.rows["T1"]["state"] == "open"


def test_too_many_calls_are_refused():
    state = records_state_new(table=table(), max_calls=2)
    records_lookup(state=state, key="T1")
    records_lookup(state=state, key="T2")
    with pytest.raises(ToolError, match="too many tool calls"):
        records_lookup(state=state, key="T1")


def test_the_grade_reads_the_final_rows_names_the_differences_and_is_deterministic():
    expected = {"T1": {"state": "closed"}}
    state = records_state_new(table=table())
    fail = records_grade(state=state, expected=expected, success="closed T1")
    assert (fail.reward, fail.reason) == (0.0, 'ticket T1: state is "open", expected "closed"')

    records_update(state=state, key="T1", values={"state": "closed"})
    assert records_grade(state=state, expected=expected, success="closed T1").reward == 1.0

    records_update(state=state, key="T2", values={"priority": 3})  # a row the task did not ask about
    grades = {records_grade(state=state, expected=expected, success="closed T1") for _ in range(3)}
    assert len(grades) == 1
    assert grades.pop().reason == "ticket T2 was changed but should not have been"


def test_writes_against_the_tasks_expected_outcome_are_policy_violations_in_words():
    from training.environments import Task
    from training.environments.records import records_audit, records_violations

    def state_for(hidden):
        return records_state_new(table=table(), task=Task(id="t", prompt="", hidden=hidden))

    # Expected: T1 closed at priority 3. Closing it at priority 2 is a wrong value of a field
    # written; writing the state again after it was already closed is a second write.
    state = state_for({"expected": {"T1": {"state": "closed", "priority": 3}}})
    records_update(state=state, key="T1", values={"state": "closed", "priority": 2})
    records_update(state=state, key="t1", values={"state": "closed"})
    assert records_violations(state=state) == [
        'ticket T1: state written again ("closed") after it already held the expected "closed"',
        "ticket T1: priority is 2, the task expects 3",
    ]
    # Writing it right, once, is no violation; neither is leaving it alone (a failure, not harm).
    right = state_for({"expected": {"T1": {"state": "closed", "priority": 3}}})
    records_update(state=right, key="T1", values={"state": "closed", "priority": 3})
    assert records_violations(state=right) == [] and records_violations(state=state_for(right.task.hidden)) == []
    # A row expected as it is, or only concerned (no expectation): any write breaks it.
    unchanged = state_for({"expected": {"T2": {"state": "open"}}, "concerns": ["T1"]})
    records_update(state=unchanged, key="T2", values={"priority": 2})
    records_update(state=unchanged, key="T1", values={"state": "closed"})
    audit = records_audit(state=unchanged, messages=[])
    assert audit.policy_violations == (
        "ticket T2: priority set to 2, but the task expects the record unchanged",
        'ticket T1: state set to "closed", but the task expects the record unchanged',
    )
    assert audit.collateral_changes == () and audit.as_dict()["policy_violations"] == list(audit.policy_violations)
    # A write to a row the task does not concern is collateral, not a violation.
    other = state_for({"expected": {"T1": {"state": "closed"}}})
    records_update(state=other, key="T2", values={"state": "closed"})
    assert records_audit(state=other, messages=[]).policy_violations == ()
