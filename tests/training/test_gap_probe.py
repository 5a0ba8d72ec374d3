"""The student-teacher gap: its arithmetic, the command that measures and stores it on the
tiny model, and the job check that offers distillation and hinted GRPO only where the gap is
large enough (an unprobed model is allowed, with a warning in the job's log)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from training.trainer.gap_probe import probe_cases, right_probability, student_teacher_gap

pytestmark = pytest.mark.django_db


def test_gap_is_the_mean_right_probability_with_the_comment_minus_without():
    result = student_teacher_gap(p_with=[0.9, 0.5, 0.2], p_without=[0.5, 0.5, 0.4], kinds=["a", "a", "b"])
    assert result.n == 3
    assert result.p_with == pytest.approx(1.6 / 3)
    assert result.p_without == pytest.approx(1.4 / 3)
    assert result.gap == pytest.approx(0.2 / 3)
    assert result.per_kind["a"] == pytest.approx({"n": 2, "p_with": 0.7, "p_without": 0.5, "gap": 0.2})
    assert result.per_kind["b"]["gap"] == pytest.approx(-0.2)
    assert right_probability(0.3, acts=True) == 0.3
    assert right_probability(0.3, acts=False) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="same length"):
        student_teacher_gap(p_with=[0.1], p_without=[])
    with pytest.raises(ValueError, match="lie in"):
        student_teacher_gap(p_with=[1.5], p_without=[0.1])


def test_probe_cases_pair_decisions_with_the_leads_comment_on_the_wrong_turn():
    cases = probe_cases(count=6)
    assert len(cases) == 6
    for case in cases:
        assert case.messages[-1]["role"] == "tool"  # right after the lookup
        order_id = case.messages[-1]["content"].split('"order_id": "')[1].split('"')[0]
        assert order_id in case.comment or "delivered" in case.comment or "window" in case.comment


def test_probe_gap_command_prints_and_stores_the_gap(base_version):
    from training.models import GapProbe

    out = StringIO()
    call_command("probe_gap", base_version.name, "--contexts", "4", stdout=out)
    probe = GapProbe.objects.get(version=base_version)
    assert probe.n == 4
    assert probe.gap == pytest.approx(probe.p_with - probe.p_without)
    assert f"gap {probe.gap:+.3f}" in out.getvalue()
    assert "stored as probe" in out.getvalue()


def _distill_set():
    from training.models import TrainingItem, TrainingSet

    training_set = TrainingSet.objects.create(name="comments")
    TrainingItem.objects.create(
        training_set=training_set,
        key="t1",
        messages=[{"role": "user", "content": "refund ORD-1 please"}],
        feedback="Delivered 3 days ago, refund it.",
    )
    return training_set


def _probe(version, gap: float):
    from training.services.gap_probes import gap_probe_record

    return gap_probe_record(version=version, result={"n": 40, "p_with": 0.5 + gap, "p_without": 0.5, "gap": gap})


def test_distillation_is_refused_below_the_gap_and_says_why(base_version, admin_client):
    from training.models import TrainingJob
    from training.services.jobs import JobError, training_job_create

    training_set = _distill_set()
    _probe(base_version, 0.02)
    with pytest.raises(JobError) as refused:
        training_job_create(
            kind="distill", config={"steps": 1}, base_version=base_version, training_set=training_set, enqueue=False
        )
    field, reason = refused.value.errors[0]
    assert field == "base_version"
    assert "not offered" in reason and "+0.020" in reason and "0.10" in reason
    # Hinted GRPO too; plain GRPO and SFT are not the gap's business.
    with pytest.raises(JobError, match="hinted GRPO is not offered"):
        training_job_create(
            kind="grpo",
            config={"steps": 1, "hint_samples": 2},
            base_version=base_version,
            training_set=training_set,
            enqueue=False,
        )
    assert not TrainingJob.objects.exists()
    # The job form shows it, next to the version and in the error.
    page = admin_client.get(reverse("training:job-list"))
    assert "not offered" in page.content.decode() and "gap 0.020" in page.content.decode()
    response = admin_client.post(
        reverse("training:job-list"),
        {"kind": "distill", "base_version": base_version.pk, "training_set": training_set.pk, "config": '{"steps": 1}'},
    )
    assert response.status_code == 400
    assert "comment-conditioned distillation is not offered for this model" in response.content.decode()


def test_a_model_not_probed_is_allowed_with_a_warning_and_a_probed_one_with_its_figure(base_version):
    from training.models import TrainingJobEvent
    from training.services.jobs import training_job_create

    training_set = _distill_set()
    job = training_job_create(
        kind="distill", config={"steps": 1}, base_version=base_version, training_set=training_set, enqueue=False
    )
    logs = [e.data["message"] for e in TrainingJobEvent.objects.filter(job=job)]
    assert any(m.startswith("warning: tiny-base was not probed with the comment at system") for m in logs)
    # A probe of another placement above the minimum is said, with a warning.
    from training.services.gap_probes import gap_probe_record

    gap_probe_record(
        version=base_version, result={"n": 40, "p_with": 0.75, "p_without": 0.5, "gap": 0.25}, hint_at="last"
    )
    job = training_job_create(
        kind="distill", config={"steps": 1}, base_version=base_version, training_set=training_set, enqueue=False
    )
    logs = [e.data["message"] for e in TrainingJobEvent.objects.filter(job=job)]
    assert any(m.startswith("warning: tiny-base was not probed with the comment at system") for m in logs)
    assert any("with the comment at last: +0.250" in m for m in logs)
    _probe(base_version, 0.25)
    job = training_job_create(
        kind="distill", config={"steps": 1}, base_version=base_version, training_set=training_set, enqueue=False
    )
    logs = [e.data["message"] for e in TrainingJobEvent.objects.filter(job=job)]
    assert any("student-teacher gap of tiny-base with the comment at system: +0.250" in m for m in logs)


def test_the_other_placement_is_no_way_around_a_gap_below_the_minimum(base_version, admin_client):
    """Probed below the minimum at one placement, a job placing the comment at the other,
    never probed, is refused as well, and the job form says so for each placement; a probe
    at that placement decides for it."""
    from training.services.gap_probes import gap_probe_record
    from training.services.jobs import JobError, training_job_create

    training_set = _distill_set()
    _probe(base_version, 0.01)
    with pytest.raises(JobError, match="not probed with the comment at last"):
        training_job_create(
            kind="distill",
            config={"steps": 1, "hint_at": "last"},
            base_version=base_version,
            training_set=training_set,
            enqueue=False,
        )
    page = admin_client.get(reverse("training:job-list")).content.decode()
    assert "with the comment at system are not offered" in page
    assert "with the comment at last are not offered: its student\u2013teacher gap with the comment at system" in page

    gap_probe_record(
        version=base_version, result={"n": 40, "p_with": 0.75, "p_without": 0.5, "gap": 0.25}, hint_at="last"
    )
    job = training_job_create(
        kind="distill",
        config={"steps": 1, "hint_at": "last"},
        base_version=base_version,
        training_set=training_set,
        enqueue=False,
    )
    assert job.pk
    page = admin_client.get(reverse("training:job-list")).content.decode()
    assert "with the comment at system are not offered" in page
    assert "with the comment at last are not offered" not in page
