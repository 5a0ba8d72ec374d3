"""A long job's page in Chromium: the phase it is in with its own progress, an ETA that
counts the evaluations left, never "100 %" while it still works, and only the charts its
method can have; the page follows the phases as the job moves, without a reload."""

from __future__ import annotations

import pytest

from tests.factories import user_with_role
from tests.training.test_job_pages import running_job, training_set, version  # noqa: F401 - fixtures
from training.models import JobEventKind, TrainingJob, TrainingJobEvent

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def test_the_job_page_follows_its_phases(open_page, running_job):  # noqa: F811
    TrainingJob.objects.filter(pk=running_job.pk).update(
        kind="sft",
        config={"kind": "sft", "steps": 10, "eval_every": 5},
        phase={"name": "loading", "done": 0, "total": 0},
        step=0,
    )
    page = open_page(user_with_role("operator", "olga"))
    page.goto(f"/training/jobs/{running_job.pk}/")
    assert "loading the model" in page.inner_text("#job-phase")
    assert "estimated after" in page.inner_text("#job-eta")
    # Loss and response length: no reward or KL for SFT.
    assert page.locator("figure.uchart canvas").count() == 2

    # The worker moves on: the polled part shows the evaluation's own progress, then the ETA.
    TrainingJobEvent.objects.create(
        job=running_job, kind=JobEventKind.EVAL, step=0, data={"success": 0.2, "n": 8, "eval_seconds": 30.0}
    )
    TrainingJob.objects.filter(pk=running_job.pk).update(
        step=10, phase={"name": "evaluation", "done": 3, "total": 8, "since": "2026-01-01T00:00:00+00:00"}
    )
    page.wait_for_selector("#job-phase[data-phase='evaluation']", timeout=10_000)
    assert "evaluating 3/8" in page.inner_text("#job-phase")
    assert "ETA 19 s" in page.inner_text("#job-eta")
    assert "(99%)" in page.inner_text("#live") and "100%" not in page.inner_text("#live")
