"""A failure mode becomes training signal and a regression test in one click: "Review in a
queue" makes an annotation queue of its traces, "Make an evaluation slice" a training set of
the turns its notes are about, every one held out, which the evaluation, the promotion's
regression check and a learning policy take as they stand."""

from __future__ import annotations

import numpy as np
import pytest

from feedback.failure_modes.services import failure_cluster_rename, failure_mode_run_execute
from feedback.models import AnnotationQueue, Comment, FailureCluster, FailureClusterMember, FailureModeRun, Trace
from feedback.services.ingest import traces_ingest
from feedback.services.queues import queue_from_failure_cluster
from tests.factories import user_with_role
from tests.failure_modes.test_cluster_names_and_flags import NEGATIVE, noted  # noqa: F401
from tests.feedback.conftest import TOOLS, tool_conversation
from tests.fixtures.judge import Reply, user_prompt
from tests.training.policies import finish_evaluation, finish_job, policy, world  # noqa: F401
from training.models import TrainingItem, TrainingSet, TrainingSplit
from training.promotion.models import EvaluationItem
from training.services.evaluation_slices import evaluation_slice_from_failure_cluster
from training.services.training_sets import TrainingSetError
from webapp.kernel.chat_format import FieldError
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db

REFUNDS = [
    "The refund amount was wrong, it refunded twice.",
    "Wrong refund amount again.",
    "It refunded the wrong amount to the customer.",
]
HOSTILE = '<script>alert("fm")</script><b>bold</b>'


def embed(texts):
    """Notes about the tracking link on one axis, about refunds on another."""
    return np.array([[1.0, 0.0] if "tracking" in t.lower() else [0.0, 1.0] for t in texts], dtype=np.float32)


def judge_names(request):
    prompt = user_prompt(request).lower()
    return Reply.json(
        {
            "name": "Missing tracking link" if "tracking" in prompt else "Wrong refund amount",
            "description": "What the notes say.",
        }
    )


@pytest.fixture
def modes(noted, judge_server):  # noqa: F811
    """Two failure modes of support-bot: four answers without the tracking link (and one note
    on a customer's question, which names no answer), and three wrong refunds."""
    items = [{"external_id": f"r{i}", "tools": TOOLS, "messages": tool_conversation()} for i in range(3)]
    traces_ingest(deployment=noted, items=items)
    olga = user_with_role("operator", "olga-2")
    for i, text in enumerate(REFUNDS):
        trace = Trace.objects.get(external_id=f"r{i}")
        Comment.objects.create(trace=trace, message=trace.messages.get(position=4), author=olga, body=text)
    first = Trace.objects.get(external_id="t0")
    Comment.objects.create(
        trace=first, message=first.messages.get(position=1), author=olga, body="Tracking questions like this one."
    )
    judge_server.respond_with(judge_names)
    run = FailureModeRun.objects.create(deployment=noted, max_traces=100)
    failure_mode_run_execute(run=run, endpoint=judge_server.endpoint(), embed=embed)
    run.refresh_from_db()
    assert run.status == WorkStatus.FINISHED, run.error
    clusters = {c.name: c for c in FailureCluster.objects.filter(run=run)}
    assert set(clusters) == {"Missing tracking link", "Wrong refund amount"}, [
        c.naming_error for c in clusters.values()
    ]
    return {"run": run, "tracking": clusters["Missing tracking link"], "refunds": clusters["Wrong refund amount"]}


def _traces(*external_ids: str) -> set[int]:
    return set(Trace.objects.filter(external_id__in=external_ids).values_list("pk", flat=True))


def test_the_queue_holds_exactly_the_failure_modes_traces_and_a_second_click_opens_it_again(modes):
    olga = user_with_role("operator", "olga")
    queue, created = queue_from_failure_cluster(cluster=modes["tracking"], created_by=olga)
    assert created
    assert set(queue.items.values_list("trace_id", flat=True)) == _traces("t0", "t1", "t2", "t3")
    assert queue.item_count == 4 and queue.failure_cluster == modes["tracking"]
    assert queue.name == "Failure mode: Missing tracking link"
    assert f"failure-mode run {modes['run'].pk}" in queue.description

    again, created = queue_from_failure_cluster(cluster=modes["tracking"], created_by=user_with_role("operator"))
    assert (again, created) == (queue, False)
    assert AnnotationQueue.objects.count() == 1 and queue.items.count() == 4

    other, created = queue_from_failure_cluster(cluster=modes["refunds"], created_by=olga)
    assert created and set(other.items.values_list("trace_id", flat=True)) == _traces("r0", "r1", "r2")


def test_a_later_runs_failure_mode_of_the_same_name_gets_a_queue_of_its_own_name(modes, judge_server):
    queue_from_failure_cluster(cluster=modes["tracking"], created_by=None)
    rerun = FailureModeRun.objects.create(deployment=modes["run"].deployment, max_traces=100)
    failure_mode_run_execute(run=rerun, endpoint=judge_server.endpoint(), embed=embed)
    later = FailureCluster.objects.get(run=rerun, name="Missing tracking link")
    queue, created = queue_from_failure_cluster(cluster=later, created_by=None)
    assert created and queue.name == f"Failure mode: Missing tracking link (run {rerun.pk})"


def test_the_slice_holds_the_failure_modes_answers_all_held_out_and_is_made_once(modes):
    olga = user_with_role("operator", "olga")
    built, created = evaluation_slice_from_failure_cluster(cluster=modes["tracking"], user=olga)
    assert created and built.failure_cluster == modes["tracking"]
    items = list(TrainingItem.objects.filter(training_set=built))
    answers = {t.messages.get(position=4).pk for t in Trace.objects.filter(pk__in=_traces("t0", "t1", "t2", "t3"))}
    # The note on t0's question names no answer: only the four answers the notes criticise.
    assert {it.message_id for it in items} == answers
    assert {it.split for it in items} == {TrainingSplit.HELDOUT}
    assert (built.item_count, built.heldout_count, built.train_count) == (4, 4, 0)
    assert {it.feedback for it in items} == set(NEGATIVE)
    assert all(it.messages[-1]["role"] == "tool" for it in items)  # the context the answer followed
    assert all(it.provenance["failure_cluster"] == modes["tracking"].pk for it in items)
    assert built.selection["failure_mode"] == "Missing tracking link"
    assert built.name == f"fm-{modes['run'].pk}-missing-tracking-link"

    again, created = evaluation_slice_from_failure_cluster(cluster=modes["tracking"], user=olga)
    assert (again, created) == (built, False)
    assert TrainingSet.objects.count() == 1


def test_a_failure_mode_without_usable_turns_is_refused_and_nothing_is_stored(noted):  # noqa: F811
    """Every note on a customer's message: no answer to evaluate."""
    run = FailureModeRun.objects.create(deployment=noted, status=WorkStatus.FINISHED)
    cluster = FailureCluster.objects.create(run=run, rank=0, name="Vague questions", flag_name="mode-vague", size=2)
    for trace in Trace.objects.order_by("pk")[:2]:
        comment = Comment.objects.create(trace=trace, message=trace.messages.get(position=1), body="Too vague.")
        FailureClusterMember.objects.create(cluster=cluster, trace=trace, comment=comment, text=comment.body)
    with pytest.raises(TrainingSetError) as refused:
        evaluation_slice_from_failure_cluster(cluster=cluster, user=None)
    assert refused.value.errors[0][0] == "cluster" and "no usable turns" in refused.value.errors[0][1]
    assert not TrainingSet.objects.exists()

    cluster.dismissed_at = run.created_at
    cluster.save(update_fields=["dismissed_at"])
    with pytest.raises(FieldError, match="dismissed"):
        queue_from_failure_cluster(cluster=cluster, created_by=None)
    assert not AnnotationQueue.objects.exists()


def test_the_slice_is_a_policys_evaluation_set_and_the_promotions_regression_slice(modes, world):  # noqa: F811
    from training.promotion.services.promotion_checks import check_regressions
    from training.promotion.services.promotion_signals import evaluation_signals

    built, _ = evaluation_slice_from_failure_cluster(cluster=modes["tracking"], user=world["olga"])
    p = policy(world, eval_training_set=built, min_new_turns=1)
    from training.learning_policies.tick import learning_policies_tick

    learning_policies_tick()
    run = p.runs.get()
    candidate = finish_job(run, world)
    learning_policies_tick()
    run.refresh_from_db()
    evaluation = run.evaluation
    assert evaluation.training_set == built
    evaluated = set(EvaluationItem.objects.filter(evaluation=evaluation).values_list("key", flat=True))
    assert evaluated == set(TrainingItem.objects.filter(training_set=built).values_list("key", flat=True))

    finish_evaluation(run, win_rate=0.25, ci_low=0.05, n=4)
    evaluation.refresh_from_db()
    (win_rate,) = [s for s in evaluation_signals(evaluation) if s.code == "win_rate"]
    assert "the evaluation slice of failure mode “Missing tracking link”" in win_rate.source
    check = check_regressions(candidate, evaluation, "")
    assert not check.ok and "Evaluation win rate" in check.detail


# Pages and API ------------------------------------------------------------------------


def test_both_buttons_open_what_they_made_and_a_second_click_makes_nothing_new(modes, client):
    client.force_login(user_with_role("operator", "olga"))
    cluster = modes["tracking"]
    page = client.get("/failure-modes/").content.decode()
    assert f'action="/failure-modes/clusters/{cluster.pk}/queue"' in page
    assert f'action="/failure-modes/clusters/{cluster.pk}/evaluation-slice"' in page

    made = client.post(f"/failure-modes/clusters/{cluster.pk}/queue")
    queue = AnnotationQueue.objects.get()
    assert made.status_code == 302 and made["Location"] == f"/queues/{queue.pk}/"
    again = client.post(f"/failure-modes/clusters/{cluster.pk}/queue", HTTP_HX_REQUEST="true")
    assert again.status_code == 200 and again["HX-Redirect"] == f"/queues/{queue.pk}/"
    assert AnnotationQueue.objects.count() == 1
    # The card links to the queue now instead of offering a second one.
    card = client.get("/failure-modes/").content.decode()
    assert f'href="/queues/{queue.pk}/" title="Failure mode: Missing tracking link">Open its queue' in card
    assert f'action="/failure-modes/clusters/{cluster.pk}/queue"' not in card

    made = client.post(f"/failure-modes/clusters/{cluster.pk}/evaluation-slice", HTTP_HX_REQUEST="true")
    built = TrainingSet.objects.get()
    assert made["HX-Redirect"] == f"/training/sets/{built.pk}/"
    assert client.post(f"/failure-modes/clusters/{cluster.pk}/evaluation-slice")["Location"] == made["HX-Redirect"]
    assert TrainingSet.objects.count() == 1

    link = f'href="/failure-modes/?run={modes["run"].pk}#cluster-{cluster.pk}">Missing tracking link</a>'
    assert link in client.get(f"/queues/{queue.pk}/").content.decode()
    set_page = client.get(f"/training/sets/{built.pk}/").content.decode()
    assert link in set_page and "4 held out" in set_page
    assert f"?training_set={built.pk}#evaluate" in set_page
    assert f'<option value="{built.pk}" selected>' in client.get(f"/models/?training_set={built.pk}").content.decode()
    policies = client.get(f"/training/policies/?eval_training_set={built.pk}").content.decode()
    assert f'<option value="{built.pk}" selected>' in policies
    # The link lands on that run's clusters.
    assert f'id="cluster-{cluster.pk}"' in client.get(f"/failure-modes/?run={modes['run'].pk}").content.decode()


def test_a_refused_slice_says_why_beside_the_buttons(noted, client):  # noqa: F811
    run = FailureModeRun.objects.create(deployment=noted, status=WorkStatus.FINISHED)
    cluster = FailureCluster.objects.create(run=run, rank=0, name="Vague", flag_name="mode-vague", size=0)
    client.force_login(user_with_role("operator", "olga"))
    refused = client.post(f"/failure-modes/clusters/{cluster.pk}/evaluation-slice", HTTP_HX_REQUEST="true")
    assert refused.status_code == 400
    assert "no usable turns" in refused.content.decode() and f'id="cluster-{cluster.pk}"' in refused.content.decode()
    plain = client.post(f"/failure-modes/clusters/{cluster.pk}/evaluation-slice", follow=True)
    assert "no usable turns" in plain.content.decode()
    assert not TrainingSet.objects.exists()


@pytest.mark.parametrize("role", ["reviewer", "approver"])
def test_a_role_without_the_right_is_refused_and_nothing_is_made(modes, client, role):
    """A reviewer may not see failure modes; an approver sees them but builds no queue or set."""
    user = user_with_role(role, f"{role}-x")
    client.force_login(user)
    cluster = modes["tracking"]
    for path in ("queue", "evaluation-slice"):
        assert client.post(f"/failure-modes/clusters/{cluster.pk}/{path}").status_code == 403
        assert client.post(f"/failure-modes/clusters/{cluster.pk}/{path}", HTTP_HX_REQUEST="true").status_code == 403
        assert client.post(f"/api/v1/failure-modes/clusters/{cluster.pk}/{path}").status_code == 403
    assert not AnnotationQueue.objects.exists() and not TrainingSet.objects.exists()
    if role == "approver":
        page = client.get("/failure-modes/").content.decode()
        assert "Review in a queue" not in page and "Make an evaluation slice" not in page


def test_hostile_failure_mode_names_are_shown_as_text(modes, client):
    cluster = failure_cluster_rename(cluster=modes["tracking"], name=HOSTILE)
    client.force_login(user_with_role("operator", "olga"))
    client.post(f"/failure-modes/clusters/{cluster.pk}/queue")
    client.post(f"/failure-modes/clusters/{cluster.pk}/evaluation-slice")
    queue, built = AnnotationQueue.objects.get(), TrainingSet.objects.get()
    assert built.name == f"fm-{modes['run'].pk}-scriptalertfmscriptbboldb"
    escaped = "&lt;script&gt;alert(&quot;fm&quot;)&lt;/script&gt;&lt;b&gt;bold&lt;/b&gt;"
    for path in ("/failure-modes/", f"/queues/{queue.pk}/", f"/training/sets/{built.pk}/", "/training/jobs/"):
        body = client.get(path).content.decode()
        assert escaped in body, path
        assert "<script>alert" not in body and "<b>bold" not in body, path


def test_the_api_makes_both_and_answers_bad_and_unknown_ids(modes, client):
    client.force_login(user_with_role("operator", "olga"))
    cluster = modes["refunds"]
    made = client.post(f"/api/v1/failure-modes/clusters/{cluster.pk}/queue")
    assert made.status_code == 201, made.content
    body = made.json()
    assert body["created"] and body["failure_mode"]["name"] == "Wrong refund amount"
    assert body["queue"]["item_count"] == 3 and body["queue"]["url"].endswith(f"/queues/{body['queue']['id']}/")
    again = client.post(f"/api/v1/failure-modes/clusters/{cluster.pk}/queue")
    assert again.status_code == 200 and again.json()["queue"]["id"] == body["queue"]["id"]

    made = client.post(f"/api/v1/failure-modes/clusters/{cluster.pk}/evaluation-slice")
    assert made.status_code == 201, made.content
    built = made.json()["training_set"]
    assert (built["heldout_count"], built["train_count"], built["failure_cluster"]) == (3, 0, cluster.pk)
    assert client.post(f"/api/v1/failure-modes/clusters/{cluster.pk}/evaluation-slice").status_code == 200

    for bad in ("abc", "\uff11\uff12", "9" * 30):  # letters, full-width digits, past bigint
        for path in ("queue", "evaluation-slice"):
            answer = client.post(f"/api/v1/failure-modes/clusters/{bad}/{path}")
            assert answer.status_code == 400, (bad, path)
            assert answer.json()["errors"][0]["field"] == "cluster"
    for path in ("queue", "evaluation-slice"):
        assert client.post(f"/api/v1/failure-modes/clusters/999999/{path}").status_code == 404
    assert AnnotationQueue.objects.count() == 1 and TrainingSet.objects.count() == 1
    client.logout()
    assert client.post(f"/api/v1/failure-modes/clusters/{cluster.pk}/queue").status_code in (401, 403)


def test_the_page_answers_a_bad_run_and_an_unknown_one(modes, client):
    client.force_login(user_with_role("operator", "olga"))
    assert client.get("/failure-modes/?run=x1").status_code == 400
    assert client.get("/failure-modes/?run=999999").status_code == 404


@pytest.mark.django_db(transaction=True)
def test_two_clicks_at_once_make_one_queue_and_one_slice(modes):
    """Both requests answer with the same queue (and the same slice): the second waits for the
    first on the cluster's row and finds what it made, instead of failing on the unique key."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    from django.db import connection

    olga = user_with_role("operator", "olga")
    barrier = Barrier(2)

    def click(make):
        try:
            barrier.wait(timeout=10)
            made, created = make()
            return made.pk, created
        finally:
            connection.close()

    for make in (
        lambda: queue_from_failure_cluster(cluster=modes["tracking"], created_by=olga),
        lambda: evaluation_slice_from_failure_cluster(cluster=modes["tracking"], user=olga),
    ):
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(click, [make, make]))
        assert {pk for pk, _ in answers} == {answers[0][0]}
        assert sorted(created for _, created in answers) == [False, True]
    assert AnnotationQueue.objects.count() == 1 and TrainingSet.objects.count() == 1
