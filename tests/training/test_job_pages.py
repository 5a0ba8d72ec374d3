"""The job list with its start form, and the live job page: charts, progress, samples,
logs, the htmx partial, cancel; untrusted text is escaped."""

from __future__ import annotations

import pytest
from django.urls import reverse

from tests.factories import UserFactory
from training.charts import chart_spec, line_chart
from training.models import JobEventKind, TrainingJob, TrainingJobEvent
from training.services.training_sets import training_set_from_tasks
from training.serving.models import BaseModel, ModelVersion
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db
XSS = '<script>alert("x")</script>'


def with_role(username: str, role: str):
    from django.contrib.auth.models import Group

    user = UserFactory(username=username)
    user.groups.add(Group.objects.get(name=role))
    return user


@pytest.fixture
def client_in(client):
    client.force_login(with_role("operator", "operator"))
    return client


@pytest.fixture
def version():
    base = BaseModel.objects.create(name="tiny", path="/models/tiny")
    return ModelVersion.objects.create(name="tiny-base", base_model=base, kind="base", path="/models/tiny")


@pytest.fixture
def training_set():
    return training_set_from_tasks(
        name="qa", tasks=[{"prompt": f"q{i}", "reference": "a", "grader": "exact"} for i in range(10)]
    )


@pytest.fixture
def running_job(version, training_set):
    job = TrainingJob.objects.create(
        kind="grpo",
        status=WorkStatus.RUNNING,
        config={"kind": "grpo", "steps": 10},
        base_version=version,
        training_set=training_set,
        step=4,
        total_steps=10,
        flagged=True,
        breaches=[{"monitor": "length", "message": f"too long {XSS}", "step": 3}],
    )
    for step in range(1, 5):
        data = {
            "reward_mean": 0.1 * step,
            "reward_std": 0.05,
            "loss": 0.5 / step,
            "kl": 0.01 * step,
            "response_length": 20 + step,
            "zero_variance_share": 0.25,
            "step_seconds": 2.0,
        }
        TrainingJobEvent.objects.create(job=job, kind=JobEventKind.STEP, step=step, data=data)
    TrainingJobEvent.objects.create(
        job=job,
        kind=JobEventKind.SAMPLE,
        step=4,
        data={"rows": [{"item": "k", "prompt": XSS, "response": f"answer {XSS}", "reward": 0.75, "advantage": 0.5}]},
    )
    TrainingJobEvent.objects.create(job=job, kind=JobEventKind.LOG, step=4, data={"message": f"hello {XSS}"})
    TrainingJobEvent.objects.create(
        job=job, kind=JobEventKind.EVAL, step=0, data={"success": 0.25, "reward": 0.25, "n": 8}
    )
    return job


def test_job_page_shows_progress_charts_samples_and_escapes_everything(client_in, running_job):
    response = client_in.get(reverse("training:job-detail", args=[running_job.pk]))
    html = response.content.decode()
    assert response.status_code == 200
    assert XSS not in html and "&lt;script&gt;" in html
    assert html.count('<figure class="uchart') == 5 and "Reward (mean ± std)" in html
    assert 'src="/static/vendor/uplot/uPlot.iife.min.js"' in html  # served from here, no CDN
    reward = chart_of(html, "chart-reward_mean")
    assert [s["label"] for s in reward["series"]] == ["training", "validation (held out)"]
    assert reward["series"][0]["points"] == [[1.0, 0.1], [2.0, 0.2], [3.0, 0.30000000000000004], [4.0, 0.4]]
    assert reward["series"][1]["points"] == [[0.0, 0.25]]  # the starting model, before step 1
    assert reward["series"][0]["band"][0] == [1, 0.05, 0.15000000000000002]
    assert 'value="40"' in html and "step 4 / 10" in html
    assert "ETA 12 s" in html  # 6 steps left x 2 s
    assert "0.750" in html  # a sample's reward
    assert 'hx-trigger="every 3s"' in html and "Cancel" in html
    assert "flagged by a monitor" in html


def chart_of(html: str, chart_id: str) -> dict:
    """The spec a page hands its chart script (json_script's element)."""
    import json
    import re

    return json.loads(re.search(rf'<script id="{chart_id}" type="application/json">(.*?)</script>', html, re.S)[1])


def test_checkpoints_are_marked_and_hover_knows_when_each_step_ran(client_in, running_job):
    TrainingJobEvent.objects.create(
        job=running_job, kind=JobEventKind.LOG, step=2, data={"message": "checkpoint at step 2"}
    )
    html = client_in.get(reverse("training:job-detail", args=[running_job.pk])).content.decode()
    for chart in ("chart-reward_mean", "chart-loss", "chart-kl"):
        assert chart_of(html, chart)["markers"] == [{"x": 2.0, "label": "checkpoint 2"}]
    loss = chart_of(html, "chart-loss")
    assert [s["label"] for s in loss["series"]] == ["training"]  # no held-out loss is measured
    assert loss["x"]["range"] == [0, 10] and set(loss["x"]["elapsed"]) == {"1", "2", "3", "4"}
    assert loss["summary"] == "Loss. training: 4 points, last 0.125"


def test_a_chart_spec_keeps_finite_points_and_reaches_the_page_escaped():
    from django.template.loader import render_to_string

    spec = chart_spec(
        chart_id="c", title=XSS, series=[{"label": XSS, "points": [(0, 1.0), (1, float("nan")), (2, None)]}], x={}
    )
    assert spec["series"][0]["points"] == [(0.0, 1.0)]
    html = render_to_string("_chart.html", {"chart": spec})
    assert XSS not in html and "&lt;script&gt;" in html  # the caption and summary
    assert "\\u003Cscript\\u003E" in html  # the JSON (json_script escapes <, > and &)


def test_the_htmx_poll_gets_only_the_live_part_and_stops_when_the_job_ends(client_in, running_job):
    url = reverse("training:job-detail", args=[running_job.pk]) + "?partial=live"
    part = client_in.get(url, headers={"HX-Request": "true"}).content.decode()
    assert part.lstrip().startswith('<section id="live"') and "<html" not in part and "Sample rollouts" not in part
    TrainingJob.objects.filter(pk=running_job.pk).update(status=WorkStatus.FINISHED)
    part = client_in.get(url, headers={"HX-Request": "true"}).content.decode()
    assert "hx-trigger" not in part and "Cancel" not in part


def test_cancel_button_flags_a_running_job(client_in, running_job):
    response = client_in.post(reverse("training:job-cancel", args=[running_job.pk]))
    assert response.status_code == 302
    running_job.refresh_from_db()
    assert running_job.status == WorkStatus.CANCELLING and running_job.cancel_requested


def test_start_form_creates_a_job_or_names_the_bad_field(client_in, version, training_set):
    url = reverse("training:job-list")
    form = {"kind": "grpo", "base_version": version.pk, "training_set": training_set.pk, "config": "{}"}
    bad = client_in.post(url, form | {"group_size": "1"})
    assert bad.status_code == 400 and '<a href="#job-group-size">Group size</a>:' in bad.content.decode()
    bad = client_in.post(url, form | {"config": "[1"})
    assert bad.status_code == 400 and "not valid JSON at line 1, column 3" in bad.content.decode()
    bad = client_in.post(url, form | {"steps": "many"})
    assert bad.status_code == 400 and "Steps</a>: must be a whole number" in bad.content.decode()
    assert not TrainingJob.objects.exists()
    ok = client_in.post(url, form | {"steps": "7", "config": '{"monitors": {"kl_budget": 0.2}}'})
    job = TrainingJob.objects.get()
    assert ok.status_code == 302 and ok["Location"] == reverse("training:job-detail", args=[job.pk])
    assert job.config["steps"] == 7 and job.config["monitors"]["kl_budget"] == 0.2
    assert job.config["model_path"] == version.path
    listing = client_in.get(url).content.decode()
    assert f"#{job.pk}" in listing


def test_pages_need_a_login(client, running_job):
    assert client.get(reverse("training:job-detail", args=[running_job.pk])).status_code == 302


def test_line_chart_draws_points_and_escapes_its_title():
    svg = line_chart([(1, 0.0), (2, 1.0), (3, float("nan"))], title=XSS, band=[(1, -0.1, 0.1), (2, 0.9, 1.1)])
    assert XSS not in svg and "&lt;script&gt;" in svg
    assert svg.count("<polyline") == 1 and "<polygon" in svg
    assert "no data yet" in line_chart([], title="empty")


def test_roles_decide_who_sees_starts_and_cancels_jobs(client, running_job, version, training_set):
    detail = reverse("training:job-detail", args=[running_job.pk])
    form = {"kind": "grpo", "base_version": version.pk, "training_set": training_set.pk, "config": "{}"}
    client.force_login(with_role("rita", "reviewer"))
    assert client.get(detail).status_code == 403
    assert client.get(reverse("training:job-list")).status_code == 403
    assert client.post(reverse("training:job-cancel", args=[running_job.pk])).status_code == 403
    assert client.post(reverse("training:set-build"), {"name": "x", "filters": ""}).status_code == 403

    client.force_login(with_role("ann", "approver"))
    page = client.get(detail).content.decode()
    assert "step 4 / 10" in page and "Cancel" not in page
    assert "Start a job" not in client.get(reverse("training:job-list")).content.decode()
    assert client.post(reverse("training:job-list"), form).status_code == 403
    assert client.post(reverse("training:job-cancel", args=[running_job.pk])).status_code == 403
    running_job.refresh_from_db()
    assert running_job.status == WorkStatus.RUNNING and TrainingJob.objects.count() == 1


def _page(client, job) -> str:
    return client.get(reverse("training:job-detail", args=[job.pk])).content.decode()


def test_each_phase_shows_its_own_progress_and_the_eta_counts_evaluations(client_in, running_job):
    running_job.config = {"kind": "grpo", "steps": 10, "eval_every": 5}
    running_job.phase = {"name": "update", "done": 5, "total": 10}
    running_job.save(update_fields=["config", "phase"])
    html = _page(client_in, running_job)
    # No evaluation timed yet (the step-0 one carries no time) and two still to come.
    assert "now: <b>updating the weights</b> 5/10" in html
    assert "ETA estimated after the first evaluation" in html

    TrainingJobEvent.objects.create(
        job=running_job, kind=JobEventKind.EVAL, step=0, data={"success": 0.2, "eval_seconds": 30.0}
    )
    html = _page(client_in, running_job)
    assert "ETA 72 s" in html and "6 steps and 2 evaluations" in html  # 6 x 2 s + 2 x 30 s

    # The last step is done but the final evaluation runs: not 100 %, no "ETA 0 s".
    TrainingJob.objects.filter(pk=running_job.pk).update(
        step=10, phase={"name": "evaluation", "done": 3, "total": 8, "since": "2026-01-01T00:00:00+00:00"}
    )
    running_job.refresh_from_db()
    html = _page(client_in, running_job)
    assert "(99%)" in html and "100%" not in html
    assert "now: <b>evaluating</b> 3/8" in html and 'class="phase-progress" max="8" value="3"' in html
    assert "ETA 19 s" in html  # the running evaluation's 5/8 left of 30 s
    TrainingJob.objects.filter(pk=running_job.pk).update(phase={"name": "export", "done": 0, "total": 1})
    html = _page(client_in, running_job)
    assert "now: <b>exporting the trained model</b>" in html and "ETA 0" not in html


def test_charts_a_method_cannot_have_are_not_drawn(client_in, running_job):
    running_job.kind = "sft"
    running_job.save(update_fields=["kind"])
    html = _page(client_in, running_job)
    assert html.count('<figure class="uchart') == 2 and "Loss" in html and "Response length" in html
    assert "Reward (mean" not in html and "KL to the starting model" not in html and "Zero-variance" not in html


def test_the_job_list_says_what_a_running_job_is_doing(client_in, running_job):
    TrainingJob.objects.filter(pk=running_job.pk).update(phase={"name": "evaluation", "done": 2, "total": 8})
    html = client_in.get(reverse("training:job-list")).content.decode()
    assert '4 / 10 <span class="muted job-phase">· evaluating 2/8</span>' in html
