"""Failure-mode clusters: only negative feedback is clustered, an unreadable name from the
judge is replaced by one from the cluster's own comments, and a person renames or dismisses
a failure mode's flag."""

from __future__ import annotations

import numpy as np
import pytest

from feedback.failure_modes.services import (
    failure_cluster_dismiss,
    failure_cluster_rename,
    failure_mode_run_execute,
)
from feedback.judge.quality import name_from_texts, name_is_readable, text_is_praise
from feedback.models import Comment, FailureCluster, FailureClusterMember, FailureModeRun, TraceFlag
from feedback.services.ingest import traces_ingest
from feedback.services.review import turn_rating_set
from tests.factories import DeploymentFactory, user_with_role
from tests.feedback.conftest import TOOLS, tool_conversation
from tests.fixtures.judge import Reply
from webapp.kernel.chat_format import FieldError
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db

NEGATIVE = [
    "Should have given the tracking link for the parcel.",
    "No tracking link in the answer, the customer had to ask again.",
    "Missing the tracking link again.",
    "It did not include the tracking link.",
]
PRAISE = ["Great answer, thanks!", "Perfect.", "Correct and helpful."]


def embed(texts):
    """Every note about the tracking link on one axis, anything else on another."""
    return np.array([[1.0, 0.0] if "tracking" in t else [0.0, 1.0] for t in texts], dtype=np.float32)


@pytest.fixture
def noted(db):
    deployment = DeploymentFactory(name="support-bot")
    items = [{"external_id": f"t{i}", "tools": TOOLS, "messages": tool_conversation()} for i in range(8)]
    traces_ingest(deployment=deployment, items=items)
    operator = user_with_role("operator", "olga")
    from feedback.models import Trace

    traces = list(Trace.objects.order_by("external_id"))
    answer = {t.pk: t.messages.get(position=4) for t in traces}
    for trace, text in zip(traces, [*NEGATIVE, *PRAISE], strict=False):
        Comment.objects.create(trace=trace, message=answer[trace.pk], author=operator, body=text)
    # A comment without praise words, on a turn its author rated well: not a failure note.
    liked = traces[7]
    Comment.objects.create(trace=liked, message=answer[liked.pk], author=operator, body="Tracking link shown here.")
    turn_rating_set(message=answer[liked.pk], user=operator, kind="thumbs", value="up")
    return deployment


def test_only_negative_feedback_is_clustered(noted, judge_server):
    judge_server.respond_with(lambda request: Reply.json({"name": "Missing tracking link", "description": "No link."}))
    run = FailureModeRun.objects.create(deployment=noted, max_traces=100)
    failure_mode_run_execute(run=run, endpoint=judge_server.endpoint(), embed=embed)
    run.refresh_from_db()
    assert run.status == WorkStatus.FINISHED, run.error
    assert run.notes_clustered == 4
    clustered = set(FailureClusterMember.objects.values_list("text", flat=True))
    assert clustered == set(NEGATIVE)
    (cluster,) = FailureCluster.objects.all()
    assert (cluster.name, cluster.named_by) == ("Missing tracking link", "judge")


def test_an_unreadable_name_from_the_judge_gives_way_to_a_representative_comment(noted, judge_server):
    judge_server.respond_with(lambda request: Reply.json({"name": "}}}} ]]] ### 0 0", "description": "..."}))
    run = FailureModeRun.objects.create(deployment=noted, max_traces=100)
    failure_mode_run_execute(run=run, endpoint=judge_server.endpoint(), embed=embed)
    (cluster,) = FailureCluster.objects.all()
    assert cluster.named_by == "comments"
    assert cluster.name in {name_from_texts([t]) for t in NEGATIVE}
    assert name_is_readable(cluster.name) and "unreadable" in cluster.naming_error
    assert cluster.flag_name.startswith("mode-") and "tracking-link" in cluster.flag_name


def test_a_failure_mode_is_renamed_with_its_flag_or_dismissed(noted, judge_server):
    judge_server.respond_with(lambda request: Reply.json({"name": "Missing tracking link", "description": "No link."}))
    run = FailureModeRun.objects.create(deployment=noted, max_traces=100)
    failure_mode_run_execute(run=run, endpoint=judge_server.endpoint(), embed=embed)
    (cluster,) = FailureCluster.objects.all()
    assert TraceFlag.objects.filter(name="mode-missing-tracking-link").count() == 4

    failure_cluster_rename(cluster=cluster, name="No parcel tracking")
    assert (cluster.name, cluster.flag_name, cluster.named_by) == (
        "No parcel tracking",
        "mode-no-parcel-tracking",
        "person",
    )
    assert TraceFlag.objects.filter(name="mode-no-parcel-tracking", source="cluster").count() == 4
    assert not TraceFlag.objects.filter(name="mode-missing-tracking-link").exists()
    with pytest.raises(FieldError) as err:
        failure_cluster_rename(cluster=cluster, name="  ")
    assert err.value.field == "name"
    with pytest.raises(FieldError):
        failure_cluster_rename(cluster=cluster, name="x" * 101)

    failure_cluster_dismiss(cluster=cluster, user=user_with_role("operator", "otto"))
    cluster.refresh_from_db()
    assert cluster.dismissed_at is not None and cluster.dismissed_by.username == "otto"
    assert not TraceFlag.objects.filter(source="cluster").exists()


def test_praise_is_told_from_criticism():
    assert all(text_is_praise(t) for t in PRAISE)
    assert not any(text_is_praise(t) for t in NEGATIVE)
    assert not text_is_praise("Good, but it should have linked the tracking page.")
