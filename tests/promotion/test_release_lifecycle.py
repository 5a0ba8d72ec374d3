"""A release is a work item: claimed, beaten at each step and ended through `webapp.kernel.work`,
and swept by the one stale-work sweep. What people rely on: a release whose worker died
does not block the deployment forever, and the live pointer moves if and only if the
release ended finished, whichever of the worker and the sweep gets there first."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

import training.promotion.services.release as release_service
from tests.promotion.conftest import evaluation_row, live_moves
from training.promotion.models import AuditAction, AuditEvent, PromotionStatus, Release, ReleaseStep
from training.promotion.services.promotion import promotion_approve, promotion_request_create
from training.promotion.services.release import release_run
from training.serving.models import LiveVersion
from webapp.kernel.work import WorkStatus, work_beat, work_claim, work_end
from webapp.tasks import stale_work_sweep_task


def approved_release(registry, operator, approver) -> Release:
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    promotion = promotion_request_create(
        candidate=registry.candidate, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
    )
    return promotion_approve(promotion=promotion, user=approver)


def silence(release: Release, minutes: int = 11) -> None:
    """The release's worker last gave a sign of life `minutes` ago (the limit is 10)."""
    since = timezone.now() - timedelta(minutes=minutes)
    Release.objects.filter(pk=release.pk).update(started_at=since, heartbeat_at=since)


@pytest.fixture
def server_that_works(monkeypatch):
    monkeypatch.setattr(release_service, "release_load", lambda version: {"loaded": "lora", "name": version.name})
    monkeypatch.setattr(release_service, "release_smoke", lambda version: {"tokens": 3, "content": "Hello"})


def test_a_release_whose_worker_died_is_failed_by_the_sweep_and_the_next_one_can_go(registry, operator, approver):
    release = approved_release(registry, operator, approver)
    dead = "deploy-1:4242:dead"
    assert work_claim(Release, pk=release.pk, worker=dead, resume_after=0) is not None
    assert work_beat(Release, pk=release.pk, worker=dead, step=ReleaseStep.LOADING)
    silence(release)

    stale_work_sweep_task()

    release.refresh_from_db()
    assert (release.status, release.step) == (WorkStatus.FAILED, ReleaseStep.LOADING)
    assert "no sign of the release's worker for 660 s (the limit is 600 s)" in release.error
    assert "failed_ms" in release.timings
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version
    assert release.promotion.status == PromotionStatus.FAILED
    failed = AuditEvent.objects.get(action=AuditAction.RELEASE_FAILED)
    assert (failed.release, failed.from_version, failed.to_version) == (
        release,
        registry.base_version,
        registry.candidate,
    )
    assert not work_beat(Release, pk=release.pk, worker=dead)  # the dead worker, were it back, stops

    # The deployment is free again: a new request is approved and its release queued.
    again = approved_release(registry, operator, approver)
    assert (again.status, again.step) == (WorkStatus.QUEUED, ReleaseStep.NONE)


def test_the_sweep_between_the_smoke_test_and_the_switch_wins_and_nothing_goes_live(
    registry, operator, approver, server_that_works, monkeypatch
):
    release = approved_release(registry, operator, approver)
    real_end = release_service.work_end

    def end_after_the_sweep(model, **kwargs):
        # The worker is at the switch (its last beat written) when the sweep finds it silent.
        if kwargs["status"] == WorkStatus.FINISHED:
            assert Release.objects.get(pk=release.pk).step == ReleaseStep.SWITCH
            silence(release)
            stale_work_sweep_task()
        return real_end(model, **kwargs)

    monkeypatch.setattr(release_service, "work_end", end_after_the_sweep)

    late = release_run(release_id=release.pk)

    assert (late.status, late.step) == (WorkStatus.FAILED, ReleaseStep.SWITCH)
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version
    assert len(live_moves(registry.deployment)) == 1  # the fixture's: nothing moved since
    assert late.promotion.status == PromotionStatus.FAILED


def test_a_release_whose_switch_committed_is_left_live_by_the_sweep(registry, operator, approver, server_that_works):
    release = release_run(release_id=approved_release(registry, operator, approver).pk)
    assert (release.status, release.step) == (WorkStatus.FINISHED, ReleaseStep.SWITCH)
    assert (release.state, release.get_state_display()) == ("live", "Live")
    assert set(release.timings) == {"picked_up_ms", "loaded_ms", "smoke_ms", "live_ms"}
    silence(release, minutes=60)

    stale_work_sweep_task()

    release.refresh_from_db()
    assert (release.status, release.error) == (WorkStatus.FINISHED, "")
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.candidate
    assert release.promotion.status == PromotionStatus.DEPLOYED
    assert not AuditEvent.objects.filter(action=AuditAction.RELEASE_FAILED).exists()


def test_a_redelivered_task_takes_the_release_over_and_the_first_workers_writes_change_nothing(
    registry, operator, approver, monkeypatch
):
    release = approved_release(registry, operator, approver)
    first = "deploy-1:100:first"
    work_claim(Release, pk=release.pk, worker=first, resume_after=0)
    seen = []

    def load(version):
        row = Release.objects.get(pk=release.pk)
        seen.append((row.status, row.step, row.get_state_display(), row.worker))
        return {"loaded": "lora", "name": version.name}

    monkeypatch.setattr(release_service, "release_load", load)
    monkeypatch.setattr(release_service, "release_smoke", lambda version: {"tokens": 3})

    live = release_run(release_id=release.pk, worker="deploy-2:200:second")

    assert seen == [(WorkStatus.RUNNING, ReleaseStep.LOADING, "Loading weights", "deploy-2:200:second")]
    assert live.status == WorkStatus.FINISHED
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.candidate
    assert not work_beat(Release, pk=release.pk, worker=first, step=ReleaseStep.SMOKE_TEST)
    assert work_end(Release, pk=release.pk, worker=first, status=WorkStatus.FAILED, error="late").status == (
        WorkStatus.FINISHED
    )
    assert release_run(release_id=release.pk).status == WorkStatus.FINISHED  # a redelivery after the end: nothing
    assert live_moves(registry.deployment)[1:] == [
        ("smol", "smol-v1", "promotion", "arno", f"promotion (release {release.pk})", release.promotion_id, release.pk)
    ]


def test_the_pages_and_the_api_show_where_a_running_release_is(client, registry, operator, approver):
    release = approved_release(registry, operator, approver)
    worker = "deploy-1:300:pages"
    work_claim(Release, pk=release.pk, worker=worker, resume_after=0)
    work_beat(Release, pk=release.pk, worker=worker, step=ReleaseStep.SMOKE_TEST)
    client.force_login(approver)

    page = client.get(f"/promotions/{release.promotion_id}/").content.decode()
    assert 'class="status status-smoke_test" id="release-status">Smoke test</span>' in page
    assert 'hx-trigger="every 1s"' in page  # still polling: the release is in progress
    assert '<span class="status status-smoke_test">Smoke test</span>' in client.get("/models/").content.decode()
    api = client.get(f"/api/v1/releases/{release.pk}").json()
    assert (api["status"], api["step"]) == ("running", "smoke_test")

    silence(release)
    stale_work_sweep_task()
    page = client.get(f"/promotions/{release.promotion_id}/").content.decode()
    assert 'id="release-status">Failed</span>' in page
    assert "no sign of the release&#x27;s worker" in page and "The previous version stayed live." in page
    assert 'hx-trigger="every 1s"' not in page  # it stopped polling
