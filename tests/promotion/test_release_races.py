"""A release against the things that can happen around it: the registry refusing the flip,
a redelivered task finishing while the first worker's step fails late, the sweep failing a
queued release just before its task runs, and a rollback whose worker died. In each the
live pointer, the promotion's status and the audit log say the same as the release."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
from django.db.models import F
from django.utils import timezone

import training.promotion.services.release as release_service
from tests.promotion.conftest import live_moves
from tests.promotion.test_release_lifecycle import approved_release, server_that_works, silence  # noqa: F401 (a fixture)
from training.promotion.models import AuditAction, AuditEvent, PromotionStatus, Release, ReleaseKind
from training.promotion.services.release import ReleaseFailed, release_run, releases_fail_stale
from training.promotion.services.rollback import rollback_request
from training.serving.models import LiveVersion, ModelVersionStatus
from webapp.kernel.work import WorkStatus, work_claim
from webapp.tasks import stale_work_sweep_task


class Unloads:
    url = "http://replica:8001"

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def adapter_unload(self, name: str) -> None:
        self.seen.append(name)


@pytest.mark.usefixtures("server_that_works")
def test_a_flip_the_registry_refuses_fails_the_release_and_moves_nothing(
    registry,
    operator,
    approver,
    monkeypatch,
):
    release = approved_release(registry, operator, approver)

    def smoke(version):
        type(version).objects.filter(pk=version.pk).update(status=ModelVersionStatus.FAILED)
        version.status = ModelVersionStatus.FAILED
        return {"tokens": 1}

    monkeypatch.setattr(release_service, "release_smoke", smoke)
    unloaded = []
    monkeypatch.setattr(release_service, "version_servers", lambda version: [Unloads(unloaded)])
    out = release_run(release_id=release.pk)
    assert out.status == WorkStatus.FAILED, out.error
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version
    assert out.promotion.status == PromotionStatus.FAILED
    assert len(live_moves(registry.deployment)) == 1  # the fixture's: nothing moved since
    assert AuditEvent.objects.filter(action=AuditAction.RELEASE_FAILED).count() == 1
    assert "live_ms" not in out.timings
    assert unloaded == [registry.candidate.name]


def test_the_first_workers_late_failure_after_a_takeover_neither_fails_nor_unloads(
    registry, operator, approver, monkeypatch
):
    release = approved_release(registry, operator, approver)
    unloaded = []
    monkeypatch.setattr(release_service, "version_servers", lambda version: [Unloads(unloaded)])
    monkeypatch.setattr(release_service, "release_smoke", lambda v: {"tokens": 1})
    calls = []

    def load(version):
        calls.append(1)
        if len(calls) == 1:
            # while the first worker loads, a redelivery takes over and finishes
            release_run(release_id=release.pk, worker="second")
            raise ReleaseFailed("first's load failed late")
        return {"loaded": "lora"}

    monkeypatch.setattr(release_service, "release_load", load)
    out = release_run(release_id=release.pk, worker="first")
    assert out.status == WorkStatus.FINISHED
    assert unloaded == []
    assert AuditEvent.objects.filter(action=AuditAction.RELEASE_FAILED).count() == 0
    assert [move[:3] for move in live_moves(registry.deployment)[1:]] == [("smol", "smol-v1", "promotion")]
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.candidate


@pytest.mark.usefixtures("server_that_works")
def test_a_queued_release_the_sweep_failed_is_not_run_by_its_late_task(registry, operator, approver):
    release = approved_release(registry, operator, approver)
    Release.objects.filter(pk=release.pk).update(created_at=timezone.now() - timedelta(minutes=11))
    stale_work_sweep_task()
    out = release_run(release_id=release.pk)
    assert out.status == WorkStatus.FAILED
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version
    assert out.promotion.status == PromotionStatus.FAILED
    assert AuditEvent.objects.filter(action=AuditAction.RELEASE_FAILED).count() == 1
    # The deployment is free: the next release goes live.
    again = approved_release(registry, operator, approver)
    assert release_run(release_id=again.pk).status == WorkStatus.FINISHED


@pytest.mark.usefixtures("server_that_works")
def test_a_rollback_whose_worker_died_is_failed_when_the_next_is_asked_and_that_one_goes(registry, operator, approver):
    release = approved_release(registry, operator, approver)
    assert release_run(release_id=release.pk).status == WorkStatus.FINISHED
    rb = rollback_request(deployment=registry.deployment, user=approver)
    assert rb.kind == ReleaseKind.ROLLBACK and rb.promotion_id == release.promotion_id
    work_claim(Release, pk=rb.pk, worker="dead", resume_after=0)
    silence(rb)
    # Asking again fails the dead one first (the undone promotion stays deployed).
    rb2 = rollback_request(deployment=registry.deployment, user=approver)
    rb.refresh_from_db()
    assert rb.status == WorkStatus.FAILED
    release.promotion.refresh_from_db()
    assert release.promotion.status == PromotionStatus.DEPLOYED
    out = release_run(release_id=rb2.pk)
    assert out.status == WorkStatus.FINISHED
    release.promotion.refresh_from_db()
    assert release.promotion.status == PromotionStatus.ROLLED_BACK
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version
    assert releases_fail_stale() == 0


class WorkerKilled(BaseException):
    """The worker process dies mid-step (out of memory, killed): nothing is written, and the
    broker delivers the task again (`acks_late`, `reject_on_worker_lost`)."""


def test_a_release_that_kills_each_worker_it_is_redelivered_to_is_failed_and_frees_the_deployment(
    registry, operator, approver, monkeypatch
):
    release = approved_release(registry, operator, approver)

    def load(version):
        raise WorkerKilled()

    monkeypatch.setattr(release_service, "release_load", load)
    for delivery in range(4):
        # Four minutes pass between deliveries; each one takes the release over at once.
        Release.objects.filter(pk=release.pk, started_at__isnull=False).update(
            started_at=F("started_at") - timedelta(minutes=4), heartbeat_at=F("heartbeat_at") - timedelta(minutes=4)
        )
        with contextlib.suppress(WorkerKilled):
            release_run(release_id=release.pk, worker=f"deploy-{delivery}")
        release.refresh_from_db()
        if release.status != WorkStatus.RUNNING:
            break
    releases_fail_stale()

    release.refresh_from_db()
    assert release.status == WorkStatus.FAILED, (release.status, release.started_at)
    assert "its workers kept stopping" in release.error
    assert release.promotion.status == PromotionStatus.FAILED
    assert AuditEvent.objects.filter(action=AuditAction.RELEASE_FAILED, release=release).count() == 1
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version
    assert approved_release(registry, operator, approver).status == WorkStatus.QUEUED


def test_a_release_killed_on_each_quick_redelivery_is_failed_at_the_attempt_cap(
    registry, operator, approver, monkeypatch, settings
):
    # Redeliveries seconds apart never reach the time limit; the count of starts ends it,
    # through the release's own failure path (promotion failed, audited, deployment freed).
    settings.WORK_MAX_ATTEMPTS = 3
    release = approved_release(registry, operator, approver)

    def load(version):
        raise WorkerKilled()

    monkeypatch.setattr(release_service, "release_load", load)
    for delivery in range(4):
        with contextlib.suppress(WorkerKilled):
            release_run(release_id=release.pk, worker=f"deploy-{delivery}")
    release.refresh_from_db()
    assert release.status == WorkStatus.FAILED and release.attempts == 4
    assert "started 3 times and stopped mid-way each time" in release.error
    assert release.promotion.status == PromotionStatus.FAILED
    assert AuditEvent.objects.filter(action=AuditAction.RELEASE_FAILED, release=release).count() == 1
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version
    assert approved_release(registry, operator, approver).status == WorkStatus.QUEUED
