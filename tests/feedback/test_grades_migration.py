"""Migration 0019 moves the grades that graders posted as customer feedback (`customer_ref:
"grader"` with a 1-5 score) into grades, leaves real customer feedback where it is, and
reweighs the search vectors so system messages can be left out of a search; and goes back."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from feedback.models import CustomerFeedback, Grade, Trace
from feedback.selectors.trace_list import traces_search

BEFORE = [("feedback", "0018_queue_failure_cluster")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_grader_feedback_becomes_grades_and_customer_feedback_stays():
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    old = migrate(BEFORE)
    deployment = old.get_model("serving", "Deployment").objects.create(name="support-bot")
    OldTrace, OldMessage = old.get_model("feedback", "Trace"), old.get_model("feedback", "Message")
    OldFeedback = old.get_model("feedback", "CustomerFeedback")
    passed, failed, complained = (
        OldTrace.objects.create(deployment=deployment, external_id=name, has_customer_feedback=True)
        for name in ("passed", "failed", "complained")
    )
    for trace in (passed, failed, complained):
        OldMessage.objects.create(
            trace=trace, position=0, role="system", content="Refund orders under the policy.", raw={}
        )
        OldMessage.objects.create(trace=trace, position=1, role="user", content="Where is my parcel?", raw={})
    OldFeedback.objects.create(
        deployment=deployment, trace=passed, customer_ref="grader", rating_kind="score", rating=5, comment="ok"
    )
    OldFeedback.objects.create(
        deployment=deployment, trace=failed, customer_ref="grader", rating_kind="score", rating=2, comment="wrong A2"
    )
    # A customer's thumbs-down on a graded trace: real feedback, which stays.
    OldFeedback.objects.create(
        deployment=deployment, trace=failed, customer_ref="cust-7", rating_kind="thumbs", rating=-1, comment="slow"
    )
    OldFeedback.objects.create(
        deployment=deployment, trace=complained, customer_ref="grader", rating_kind="", comment="no score: not a grade"
    )
    OldTrace.objects.filter(pk__in=[passed.pk, failed.pk]).update(feedback_rating=-1)
    if connection.vendor == "postgresql":  # the vectors as the code before built them
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE feedback_trace t SET search_vector = to_tsvector('english', d.doc) FROM "
                "(SELECT trace_id, string_agg(content, E'\\n' ORDER BY position) AS doc FROM feedback_message "
                "GROUP BY trace_id) d WHERE t.id = d.trace_id"
            )

    migrate(leaves)
    grades = {g.trace.external_id: g for g in Grade.objects.select_related("trace")}
    assert set(grades) == {"passed", "failed"}
    assert (grades["passed"].outcome, grades["passed"].score, grades["passed"].reason) == ("success", 1.0, "ok")
    assert (grades["failed"].outcome, grades["failed"].score, grades["failed"].source) == ("failure", 0.25, "grader")
    remaining = set(CustomerFeedback.objects.values_list("trace__external_id", "customer_ref"))
    assert remaining == {("failed", "cust-7"), ("complained", "grader")}
    traces = {t.external_id: t for t in Trace.objects.all()}
    # The feedback columns now say what customers said, and the outcome what the grader found.
    assert (traces["passed"].has_customer_feedback, traces["passed"].feedback_rating) == (False, None)
    assert (traces["failed"].has_customer_feedback, traces["failed"].feedback_rating) == (True, -1)
    assert (traces["failed"].outcome, traces["failed"].outcome_reason) == ("failure", "wrong A2")
    assert (traces["passed"].outcome, traces["complained"].outcome) == ("success", "")
    if connection.vendor == "postgresql":
        assert not traces_search(Trace.objects.all(), "refund").exists()
        assert traces_search(Trace.objects.all(), "refund", include_system=True).count() == 3
        assert traces_search(Trace.objects.all(), "parcel").count() == 3

    old = migrate(BEFORE)
    back = old.get_model("feedback", "CustomerFeedback").objects.filter(customer_ref="grader", rating_kind="score")
    assert sorted(back.values_list("trace__external_id", "rating", "comment")) == [
        ("failed", 2, "wrong A2"),
        ("passed", 5, "ok"),
    ]
    assert old.get_model("feedback", "Trace").objects.get(external_id="passed").has_customer_feedback
    migrate(leaves)
