"""The overview page: per deployment, traffic, feedback, failure modes, the live version,
and success rate and reward per model version, from graded outcomes posted as customer
feedback. Bounded queries, escaped content, 400 on a bad window, roles respected."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from feedback.models import Message, MessageRole
from feedback.services.customer_feedback import customer_feedback_create
from feedback.services.flags import trace_flag_set
from feedback.services.grades import grade_record
from feedback.services.review import comment_add
from tests.factories import DeploymentFactory, TraceFactory, user_with_role
from tests.promotion.conftest import make_adapter_folder
from tests.training.test_job_pages import chart_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def versions(tmp_path):
    from training.serving.services import base_model_register, live_version_set, model_version_create

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    base, base_version = base_model_register(name="smol", path=tmp_path / "base")
    deployment = DeploymentFactory(
        name="support-bot", description="<script>window.__overview_xss = 1; alert('desc')</script>"
    )
    live_version_set(deployment=deployment, version=base_version)
    candidate = model_version_create(
        name="smol-v1", base_model=base, kind="lora", path=make_adapter_folder(tmp_path / "v1"), parent=base_version
    )
    return deployment, base_version, candidate


def graded_traces(deployment, version, outcomes, *, start=0, when=None, split="test", tasks=None):
    """One trace per outcome (True = success), served by `version`, with its grade; `tasks`
    names each trace's task id."""
    traces = []
    for i, ok in enumerate(outcomes, start):
        metadata = {"split": split} | ({"task_id": tasks[i - start]} if tasks else {})
        trace = TraceFactory(
            deployment=deployment, external_id=f"{version.name}-{i}", model_version=version, metadata=metadata
        )
        if when is not None:
            trace.started_at = when
            trace.save(update_fields=["started_at"])
        Message.objects.create(trace=trace, position=0, role=MessageRole.USER, content="Refund A1001?", raw={})
        Message.objects.create(trace=trace, position=1, role=MessageRole.ASSISTANT, content="Done.", raw={})
        grade_record(
            deployment=deployment,
            data={"trace_id": trace.pk, "outcome": "success" if ok else "failure", "reason": "graded"},
        )
        traces.append(trace)
    return traces


def test_success_rate_and_reward_per_version_and_the_live_version(client, versions, django_assert_max_num_queries):
    from training.serving.services import live_version_set

    deployment, base_version, candidate = versions
    base_traces = graded_traces(deployment, base_version, [True, False, False, False])  # 0.25
    live_version_set(deployment=deployment, version=candidate)
    graded_traces(deployment, candidate, [True, True, True, False], start=10)  # 0.75
    graded_traces(deployment, candidate, [False, False], start=20, split="train")  # not held out
    operator = user_with_role("operator")
    message = base_traces[1].messages.get(position=1)
    comment_add(message=message, author=operator, body="<b>refunded an order the policy forbids</b>")
    customer_feedback_create(
        deployment=deployment, data={"trace_id": base_traces[2].pk, "rating": "down", "comment": "no"}
    )
    trace_flag_set(trace=base_traces[3], name="wrong-refund", source="detector")
    client.force_login(operator)

    with django_assert_max_num_queries(20):
        response = client.get(reverse("overview"))
    assert response.status_code == 200
    html = response.content.decode()
    o = response.context["overviews"][0]
    assert o.live_version == "smol-v1"
    rates = {v.name: (v.graded, v.success_rate, v.heldout_success_rate, v.live) for v in o.versions}
    assert rates == {"smol": (4, 0.25, 0.25, False), "smol-v1": (6, 0.5, 0.75, True)}
    assert {v.name: v.mean_reward for v in o.versions} == {"smol": 0.25, "smol-v1": 0.5}
    assert [v.name for v in o.versions] == ["smol", "smol-v1"]  # in the order they were first graded
    assert (o.graded_success, o.graded_failure, o.comments, o.customer_negative) == (4, 6, 1, 1)
    assert o.failure_modes == [("wrong-refund", 1)]
    assert o.traces_per_day[-1] == 10 and o.traces_total == 10
    # The curve: each version's rolling success rate on one split (held-out, where both ran),
    # in the order the outcomes arrived; smol-v1's two training-split outcomes are not drawn.
    assert [(p.version, round(p.rate, 2)) for p in o.curve] == [
        ("smol", 1.0), ("smol", 0.5), ("smol", 0.33), ("smol", 0.25),
        ("smol-v1", 1.0), ("smol-v1", 1.0), ("smol-v1", 1.0), ("smol-v1", 0.75),
    ]  # fmt: skip
    curve = chart_of(html, f"chart-success-{deployment.pk}")
    assert "smol-v1: 4 points, last 75%" in curve["summary"]
    assert [s["label"] for s in curve["series"]] == ["smol", "smol-v1"] and curve["y"]["range"] == [0, 1]
    traffic = chart_of(html, f"chart-traffic-{deployment.pk}")
    assert traffic["kind"] == "bars" and [y for _, y in traffic["series"][0]["points"]][-1] == 10
    assert "<script>window.__overview_xss" not in html and "&lt;script&gt;window.__overview_xss" in html
    assert re.search(r'href="/overview/"[^>]*>Overview</a>', html)  # the nav links here


def test_the_window_bounds_the_counts_and_the_queries_do_not_grow_with_traffic(
    client, versions, django_assert_num_queries
):
    deployment, base_version, _ = versions
    graded_traces(deployment, base_version, [True], when=timezone.now() - timedelta(days=20))
    graded_traces(deployment, base_version, [False, True], start=5)
    client.force_login(user_with_role("operator"))
    response = client.get(reverse("overview"), {"days": 30})
    o = response.context["overviews"][0]
    assert o.traces_total == 3 and len(o.days) == 30
    o = client.get(reverse("overview")).context["overviews"][0]
    assert o.traces_total == 2 and len(o.days) == 14
    assert {v.name: v.graded for v in o.versions}["smol"] == 3  # feedback counts by when it was given

    with CaptureQueriesContext(connection) as few:
        client.get(reverse("overview"))
    graded_traces(deployment, base_version, [True] * 30, start=100)
    with CaptureQueriesContext(connection) as many:
        client.get(reverse("overview"))
    assert len(many.captured_queries) == len(few.captured_queries)


@pytest.mark.parametrize("days", ["abc", "5", "-1"])
def test_a_bad_window_is_a_400_naming_the_field(client, versions, days):
    client.force_login(user_with_role("operator"))
    response = client.get(reverse("overview"), {"days": days})
    assert response.status_code == 400 and "days: must be one of 14, 7, 30, 90" in response.content.decode()


def test_roles(client, versions):
    assert client.get(reverse("overview")).status_code == 302  # to the login page
    client.force_login(user_with_role("reviewer"))
    assert client.get(reverse("overview")).status_code == 403
    client.force_login(user_with_role("approver"))
    assert client.get(reverse("overview")).status_code == 200


def test_versions_are_compared_on_one_split_and_on_the_tasks_all_of_them_ran(client, versions):
    """The base served mostly training tasks, the candidate held-out ones: success on
    different splits is not an improvement. The comparison takes one split for every version,
    and the tasks both ran there, and says which; the chart draws that split."""
    from training.serving.services import live_version_set

    deployment, base_version, candidate = versions
    graded_traces(deployment, base_version, [True] * 6 + [False] * 4, split="train")  # 0.6 on train
    test = dict(split="test")  # the support desk's test split
    graded_traces(
        deployment, base_version, [True, False, False, False], start=20, tasks=["t1", "t2", "t3", "t4"], **test
    )
    live_version_set(deployment=deployment, version=candidate)
    graded_traces(deployment, candidate, [True, True, True], start=30, tasks=["t1", "t2", "t9"], **test)
    client.force_login(user_with_role("operator"))

    response = client.get(reverse("overview"))
    o = response.context["overviews"][0]
    c = o.comparison
    assert (c.split, c.common_tasks, c.splits) == ("test", 2, ["test", "train"])
    assert c.rows == [
        ("smol", 4, 1, 0.25, 2, 1, 0.5),  # t1 succeeded, t2 failed
        ("smol-v1", 3, 3, 1.0, 2, 2, 1.0),
    ]
    assert {p.version for p in o.curve} == {"smol", "smol-v1"} and len(o.curve) == 7  # held-out only
    html = response.content.decode()
    assert 'Like with like: <span class="compare-split">test</span> tasks' in html
    assert "Success rate per model version on test tasks" in html
    assert {v.name: v.split_cells for v in o.versions} == {
        "smol": [("test", 4, 1, 0.25), ("train", 10, 6, 0.6)],
        "smol-v1": [("test", 3, 3, 1.0), ("train", 0, 0, None)],
    }

    # On the training split only the base has episodes: the page says so, it does not mix.
    o = client.get(reverse("overview"), {"split": "train"}).context["overviews"][0]
    assert o.comparison.split == "train" and [r[0] for r in o.comparison.rows] == ["smol"]
