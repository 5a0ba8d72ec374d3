"""Grades: a grader's verdict stored as a grade (never as customer feedback), sent with a trace
at ingest or on its own through POST /api/v1/grades, giving the trace its outcome."""

from __future__ import annotations

import pytest

from feedback.models import CustomerFeedback, Grade, Trace
from feedback.services.grades import trace_outcome_of
from tests.feedback.conftest import tool_conversation

pytestmark = pytest.mark.django_db
GRADES = "/api/v1/grades"
TRACES = "/api/v1/traces"


def post(client, key, url, body):
    return client.post(url, body, content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {key}")


def item(external_id: str, **extra) -> dict:
    return {"external_id": external_id, "messages": tool_conversation(), **extra}


def test_a_trace_sent_with_its_grade_lists_with_its_outcome_and_is_not_customer_feedback(
    client, deployment, ingest_key
):
    failed = {"outcome": "failure", "score": 0.0, "reason": "refunded A2, not A1", "source": "support-desk"}
    answer = post(
        client,
        ingest_key,
        TRACES,
        {"traces": [item("ep-1", grades=[failed]), item("ep-2", grades=[{"outcome": "success"}]), item("ep-3")]},
    )
    assert answer.status_code == 207 and answer.json()["created"] == 3
    traces = {t.external_id: t for t in Trace.objects.all()}
    assert (traces["ep-1"].outcome, traces["ep-1"].outcome_reason, traces["ep-1"].outcome_score) == (
        "failure",
        "refunded A2, not A1",
        0.0,
    )
    assert (traces["ep-2"].outcome, traces["ep-2"].outcome_score) == ("success", None)
    assert traces["ep-3"].outcome == ""
    grade = Grade.objects.get(trace=traces["ep-1"])
    assert (grade.name, grade.source) == ("outcome", "support-desk")
    assert Grade.objects.get(trace=traces["ep-2"]).source == "api"
    # A grade is not what a customer said: nothing is stored or flagged as customer feedback.
    assert not CustomerFeedback.objects.exists()
    assert not Trace.objects.filter(has_customer_feedback=True).exists()
    # Not kept twice: the submitted item's raw form leaves the grades to their own rows.
    assert "grades" not in traces["ep-1"].raw

    summaries = client.get(TRACES, HTTP_AUTHORIZATION=f"Bearer {ingest_key}").json()["results"]
    by_id = {s["external_id"]: s for s in summaries}
    assert (by_id["ep-1"]["outcome"], by_id["ep-1"]["outcome_reason"]) == ("failure", "refunded A2, not A1")
    assert by_id["ep-3"]["outcome"] is None
    detail = client.get(f"{TRACES}/{traces['ep-1'].pk}", HTTP_AUTHORIZATION=f"Bearer {ingest_key}").json()
    assert detail["outcome"] == "failure" and detail["grades"][0]["reason"] == "refunded A2, not A1"


def test_a_bad_grade_refuses_its_item_naming_the_field_and_keeps_the_others(client, deployment, ingest_key):
    answer = post(
        client,
        ingest_key,
        TRACES,
        {
            "traces": [
                item("bad-outcome", grades=[{"outcome": "passed"}]),
                item("bad-score", grades=[{"outcome": "success", "score": 7}]),
                item("typo", grades=[{"outcome": "success", "reasn": "x"}]),
                item("twice", grades=[{"outcome": "success"}, {"outcome": "failure"}]),
                item("fine", grades=[{"outcome": "failure", "name": "policy"}]),
            ]
        },
    ).json()
    errors = {r["external_id"]: r.get("errors", [{}])[0] for r in answer["results"]}
    assert errors["bad-outcome"] == {"field": "grades[0].outcome", "reason": "required: 'success' or 'failure'"}
    assert errors["bad-score"] == {"field": "grades[0].score", "reason": "7 is outside 0 to 1"}
    assert errors["typo"]["field"] == "grades[0].reasn"
    assert errors["twice"]["field"] == "grades[1].name"
    assert answer["created"] == 1 and Trace.objects.get().outcome == "failure"


def test_the_grades_api_grades_a_stored_trace_and_a_second_grade_of_a_name_replaces_the_first(
    client, deployment, ingest_key
):
    post(client, ingest_key, TRACES, {"traces": [item("conv-9")]})
    trace = Trace.objects.get()
    first = post(client, ingest_key, GRADES, {"external_id": "conv-9", "outcome": "success", "reason": "tests pass"})
    assert first.status_code == 201 and first.json()["outcome"] == "success"
    trace.refresh_from_db()
    assert (trace.outcome, trace.outcome_reason) == ("success", "tests pass")

    # The same name again (a retry, or a regrade) replaces it: one grade per name and trace.
    again = post(
        client, ingest_key, GRADES, {"trace_id": trace.pk, "outcome": "failure", "score": 0.25, "reason": "flaky"}
    )
    assert again.status_code == 200 and Grade.objects.count() == 1
    trace.refresh_from_db()
    assert (trace.outcome, trace.outcome_score) == ("failure", 0.25)

    # Another name is another grade; one failure makes the trace a failure whatever passed.
    post(client, ingest_key, GRADES, {"trace_id": trace.pk, "outcome": "failure", "score": 0.25, "reason": "flaky"})
    post(client, ingest_key, GRADES, {"trace_id": trace.pk, "name": "tone", "outcome": "success"})
    trace.refresh_from_db()
    assert trace.outcome == "failure" and Grade.objects.count() == 2
    post(client, ingest_key, GRADES, {"trace_id": trace.pk, "outcome": "success"})
    trace.refresh_from_db()
    assert (trace.outcome, trace.outcome_reason) == ("success", "")


def test_the_grades_api_says_which_field_is_wrong_and_what_it_may_grade(client, deployment, make_key, ingest_key):
    post(client, ingest_key, TRACES, {"traces": [item("conv-1")]})
    cases = [
        ({"external_id": "conv-1"}, 400, "outcome"),
        ({"external_id": "conv-1", "outcome": "success", "score": True}, 400, "score"),
        ({"external_id": "conv-1", "outcome": "success", "name": "a b"}, 400, "name"),
        ({"external_id": "conv-1", "outcome": "success", "source": "x" * 101}, 400, "source"),
        ({"response_id": "chatcmpl-42", "outcome": "success"}, 400, "response_id"),
        ({"outcome": "success"}, 400, "trace_id"),
        ({"external_id": "nope", "outcome": "success"}, 404, "external_id"),
    ]
    for body, code, field in cases:
        answer = post(client, ingest_key, GRADES, body)
        assert answer.status_code == code, (body, answer.content)
        assert answer.json()["errors"][0]["field"] == field, (body, answer.json())
    assert not Grade.objects.exists()
    # Grades come from the harness that ran the traces (the ingest scope); a customer-facing
    # feedback key cannot post a verdict.
    feedback_only = make_key(deployment, ["feedback"])
    answer = post(client, feedback_only, GRADES, {"external_id": "conv-1", "outcome": "success"})
    assert answer.status_code == 403


def test_the_trace_outcome_is_the_latest_failure_else_the_latest_success():
    from datetime import UTC, datetime

    def g(pk, outcome, minute, reason):
        return Grade(pk=pk, outcome=outcome, reason=reason, updated_at=datetime(2026, 1, 1, 0, minute, tzinfo=UTC))

    assert trace_outcome_of([]) == ("", "", None)
    grades = [g(1, "success", 1, "a"), g(2, "failure", 2, "b"), g(3, "failure", 3, "c"), g(4, "success", 4, "d")]
    assert trace_outcome_of(grades)[:2] == ("failure", "c")
    assert trace_outcome_of([g(1, "success", 5, "a"), g(2, "success", 4, "b")])[:2] == ("success", "a")
    assert len(trace_outcome_of([g(1, "failure", 1, "x" * 1000)])[1]) == 300
