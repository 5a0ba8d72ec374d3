"""A deployment's story page: its versions newest first, each with when it went live, what
its training set was built from (oracle labels named as such), its evaluation, who asked and
who approved; the success curve with the version changes marked; a fixed number of queries
however many versions; escaped user text; 400 on a bad window, 404 on an unknown deployment."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from tests.factories import DeploymentFactory, TraceFactory, user_with_role
from tests.promotion.conftest import make_adapter_folder
from tests.test_overview import graded_traces
from tests.training.test_job_pages import chart_of
from training.models import TrainingItem, TrainingJob
from training.promotion.models import Evaluation, PromotionRequest
from training.services.training_sets import training_set_create
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db

XSS = "<script>window.__story_xss = 1</script>"


@pytest.fixture
def world(tmp_path):
    from training.serving.services import base_model_register, live_version_set

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    base, base_version = base_model_register(name="smol", path=tmp_path / "base")
    deployment = DeploymentFactory(name="support-bot")
    olga, arno = user_with_role("operator", "olga"), user_with_role("approver", "arno")
    live_version_set(deployment=deployment, version=base_version, user=arno, reason="first serve")
    return {"deployment": deployment, "base": base, "base_version": base_version, "olga": olga, "arno": arno}


def items_from_feedback_and_episodes(deployment, tag: str) -> list[dict]:
    """Two commented turns (one corrected by an operator, one judged with the judge's
    correction and a customer's feedback), and three oracle-labelled turns of two episodes."""
    first, second = (TraceFactory(deployment=deployment, external_id=f"{tag}-ep-{i}") for i in range(2))
    turn = {"kind": "turn", "messages": [{"role": "user", "content": "Where is A1?"}]}
    task = {"kind": "task", "messages": [{"role": "user", "content": "Refund A1?"}], "grader": "tool_action"}
    oracle = {"environment": "support-desk", "task_id": "t1", "split": "train", "labels": "oracle"}
    return [
        turn
        | {
            "key": f"{tag}-t1",
            "corrected_response": "Let me look.",
            "correction_source": "human",
            "provenance": {"comments": [1, 2], "customer_feedback": [], "corrections": [4], "judge_result": None},
        },
        turn
        | {
            "key": f"{tag}-t2",
            "corrected_response": "Looking A1 up.",
            "correction_source": "judge",
            "provenance": {"comments": [3], "customer_feedback": [9], "corrections": [], "judge_result": 12},
        },
        task | {"key": f"{tag}-e1", "trace_id": first.pk, "corrected_response": "x", "provenance": oracle},
        task | {"key": f"{tag}-e2", "trace_id": first.pk, "corrected_response": "y", "provenance": oracle},
        task | {"key": f"{tag}-e3", "trace_id": second.pk, "corrected_response": "z", "provenance": oracle},
    ]


def trained_version(world, name: str, *, comment: str = "looks right"):
    """A candidate trained here from the live version, evaluated, requested by olga, approved
    by arno and put live (as its release's worker would)."""
    from training.serving.selectors import live_version_get
    from training.serving.services import live_version_set, model_version_create

    deployment = world["deployment"]
    live = live_version_get(deployment_id=deployment.pk)
    training_set = training_set_create(
        name=f"{name}-set", items=items_from_feedback_and_episodes(deployment, name), deployment=deployment
    )
    version = model_version_create(
        name=name,
        base_model=world["base"],
        kind="lora",
        path=make_adapter_folder(world["tmp"] / name),
        parent=live,
        deployment=deployment,
    )
    TrainingJob.objects.create(
        kind="sft",
        config={},
        base_version=live,
        training_set=training_set,
        result_version=version,
        deployment=deployment,
        status=WorkStatus.FINISHED,
    )
    evaluation = Evaluation.objects.create(
        deployment=deployment,
        candidate=version,
        baseline=live,
        training_set=training_set,
        status=WorkStatus.FINISHED,
        total=8,
        done=8,
        sources={"training_set": {"id": training_set.pk, "name": "orders v3"}},
        summary={"comparison": {"win_rate": 0.75, "ci_low": 0.41, "ci_high": 0.93, "n": 8}},
    )
    PromotionRequest.objects.create(
        deployment=deployment,
        candidate=version,
        from_version=live,
        evaluation=evaluation,
        status="deployed",
        requested_by=world["olga"],
        decided_by=world["arno"],
        decided_at=timezone.now(),
        decision_comment=comment,
    )
    live_version_set(deployment=deployment, version=version, user=world["arno"], reason=f"promotion of {name}")
    return version


@pytest.fixture
def story(world, tmp_path):
    world["tmp"] = tmp_path
    return world


def test_each_version_tells_what_it_learned_from_its_evaluation_and_who_approved_it(client, story):
    deployment, base_version = story["deployment"], story["base_version"]
    graded_traces(deployment, base_version, [True, False, False, False])
    v1 = trained_version(story, "smol-v1", comment=XSS)
    graded_traces(deployment, v1, [True, True, True, False], start=10)
    client.force_login(user_with_role("operator"))

    response = client.get(reverse("deployment-story", args=["support-bot"]))
    assert response.status_code == 200
    s = response.context["story"]
    assert [v.version.name for v in s.versions] == ["smol-v1", "smol"]  # newest first
    newest, base = s.versions
    assert newest.live_now and not base.live_now
    assert [(who, why) for _, who, why in newest.went_live] == [("arno", "promotion of smol-v1")]
    assert [(who, why) for _, who, why in base.went_live] == [("arno", "first serve")]
    learned = newest.learned
    counts = {
        k: getattr(learned, k)
        for k in (
            "items", "comments", "customer_feedback", "operator_corrections", "customer_corrections",
            "judge_corrections", "judge_results", "oracle_labels", "episodes",
        )
    }  # fmt: skip
    assert counts == {
        "items": 5,
        "comments": 3,
        "customer_feedback": 1,
        "operator_corrections": 1,
        "customer_corrections": 0,
        "judge_corrections": 1,
        "judge_results": 1,
        "oracle_labels": 3,
        "episodes": 2,
    }
    assert base.learned is None
    e = newest.evaluation
    assert (e.win_rate, e.ci_low, e.ci_high, e.n, e.baseline) == (0.75, 0.41, 0.93, 8, "smol")
    assert e.held_out == "held-out items of orders v3"
    p = newest.promotion
    assert (p.requested_by, p.decided_by, p.status) == ("olga", "arno", "deployed")
    assert (newest.traffic.graded, newest.traffic.successes) == (4, 3)
    assert (base.traffic.graded, base.traffic.successes) == (4, 1)

    html = response.content.decode()
    section = html[html.index('id="version-smol-v1"') : html.index('id="version-smol"')]
    assert "3</span> oracle labels" in section and "not feedback" in section
    assert 'requested by <b class="requested-by">olga</b>' in section and '<b class="decided-by">arno</b>' in section
    assert "75.0%" in section and "[41.0%, 93.0%] Wilson 95%" in section and "orders v3" in section
    # The approver's comment is user text: escaped, never markup.
    assert XSS not in html and "&lt;script&gt;window.__story_xss" in html
    # The curve: a series per version, a dashed marker at each change of the live version.
    curve = chart_of(html, "chart-story")
    assert {s["label"] for s in curve["series"]} >= {"smol-v1 · graded success", "smol · graded success"}
    assert [m["label"] for m in curve["markers"]] == ["→ smol", "→ smol-v1"]
    assert [name for _, name in s.changes] == ["smol", "smol-v1"]


def test_the_overview_links_each_deployment_to_its_story(client, story):
    client.force_login(user_with_role("operator"))
    html = client.get(reverse("overview")).content.decode()
    assert f'href="{reverse("deployment-story", args=["support-bot"])}"' in html


def test_more_versions_read_no_more_queries(client, story):
    client.force_login(user_with_role("operator"))
    url = reverse("deployment-story", args=["support-bot"])
    trained_version(story, "smol-v1")
    client.get(url)  # the session and the permissions are warm from here on
    with CaptureQueriesContext(connection) as one:
        assert client.get(url).status_code == 200
    for i in range(2, 6):
        trained_version(story, f"smol-v{i}")
    graded_traces(story["deployment"], story["base_version"], [True, False], start=40)
    with CaptureQueriesContext(connection) as five:
        response = client.get(url)
    assert [v.version.name for v in response.context["story"].versions] == [
        "smol-v5", "smol-v4", "smol-v3", "smol-v2", "smol-v1", "smol",
    ]  # fmt: skip
    assert all(v.learned.oracle_labels == 3 for v in response.context["story"].versions[:5])
    assert len(five) == len(one), [q["sql"] for q in five.captured_queries]
    assert len(one) <= 14


def test_a_bad_window_is_a_400_an_unknown_deployment_a_404_and_reviewers_are_kept_out(client, story):
    client.force_login(user_with_role("operator"))
    url = reverse("deployment-story", args=["support-bot"])
    for bad in ("7", "x", "²", "9" * 30):
        response = client.get(url, {"days": bad})
        assert response.status_code == 400 and b"days: must be one of 90, 30, 365" in response.content
    assert client.get(url, {"days": "30"}).context["story"].days == 30
    assert client.get(reverse("deployment-story", args=["nobody"])).status_code == 404
    client.force_login(user_with_role("reviewer"))
    assert client.get(url).status_code == 403


def test_a_version_not_trained_here_says_so_and_items_without_provenance_count_nothing(story):
    from webapp.site.selectors_story import _learned, deployment_story

    training_set = training_set_create(
        name="plain",
        items=[{"kind": "task", "key": "k1", "grader": "exact", "messages": [{"role": "user", "content": "hi"}]}],
    )
    TrainingItem.objects.filter(training_set=training_set).update(provenance={"comments": "not a list"})
    story_now = deployment_story(deployment=story["deployment"])
    assert [(v.version.name, v.learned) for v in story_now.versions] == [("smol", None)]
    assert _learned([training_set.pk])[training_set.pk]["comments"] == 0


def test_a_name_no_deployment_can_have_is_a_404_never_a_500(client, story):
    # Deployment names are slugs: markup or a space is none. A NUL (which PostgreSQL text
    # cannot hold) is refused at the door, before the URL is resolved.
    client.force_login(user_with_role("operator"))
    for name in ("%3Cscript%3E", "support-bot%20"):
        assert client.get(f"/overview/{name}/story/").status_code == 404
    assert client.get("/overview/a%00b/story/").status_code == 400


def test_the_window_is_whole_days_and_nothing_before_its_first_day_is_counted_or_drawn(story):
    """'The last 30 days' is today and the 29 before it: grades from the evening of the day
    before is neither in the totals nor drawn left of the chart's axis."""
    from feedback.models import Grade
    from webapp.site.selectors_story import deployment_story, story_curve

    deployment, base_version = story["deployment"], story["base_version"]
    now = timezone.now().replace(hour=12, minute=0)
    first_day = timezone.localdate(now) - timedelta(days=29)
    day_before = timezone.make_aware(datetime.combine(first_day - timedelta(days=1), time(23, 0)))
    graded_traces(deployment, base_version, [True, True], start=60)
    Grade.objects.update(created_at=day_before)
    graded_traces(deployment, base_version, [False], start=70)
    Grade.objects.filter(created_at__gt=day_before).update(
        created_at=timezone.make_aware(datetime.combine(first_day, time(0, 30)))
    )

    s = deployment_story(deployment=deployment, days=30, now=now)
    assert s.first_day == first_day and [(p.day, p.graded) for p in s.points] == [(first_day, 1)]
    (base,) = s.versions
    assert (base.traffic.graded, base.traffic.successes) == (1, 0)
    curve = story_curve(s)
    xs = [x for line in curve["series"] for x, _ in line["points"]]
    start = datetime.combine(first_day, time(0), tzinfo=UTC).timestamp()
    assert xs and min(xs) >= start


def test_the_story_axis_fits_its_data_not_the_whole_window(story):
    """One day of traffic in a 90-day window sits in the middle of a week-wide axis, not at
    the edge of 90 days; a longer story gets an axis as long as its data."""
    from feedback.models import Grade
    from webapp.site.selectors_story import deployment_story, story_curve

    deployment, base_version = story["deployment"], story["base_version"]
    now = timezone.now().replace(hour=12, minute=0)
    graded_traces(deployment, base_version, [True, False], start=80)
    s = deployment_story(deployment=deployment, days=90, now=now)
    curve = story_curve(s)
    (x,) = {x for line in curve["series"] for x, _ in line["points"]}
    low, high = curve["x"]["range"]
    day = 86_400
    assert high - low == 7 * day
    changes = [m["x"] for m in curve["markers"]]
    assert low <= min([x, *changes]) and max([x, *changes]) <= high
    Grade.objects.filter(trace__external_id=f"{base_version.name}-80").update(created_at=now - timedelta(days=20))
    curve = story_curve(deployment_story(deployment=deployment, days=90, now=now))
    low, high = curve["x"]["range"]
    assert 20 * day < high - low < 23 * day
