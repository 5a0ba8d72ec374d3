"""An evaluation whose worker died does not stay "running" (and so never becomes evidence):
the periodic sweep fails it with the reason and an audit record, and a worker that was only
slow stops at its next item instead of finishing it afterwards."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.promotion.conftest import evaluation_row
from training.promotion.models import AuditAction, AuditEvent, EvaluationItem
from training.promotion.services import evaluation as evaluation_service
from training.promotion.services.evaluation import evaluation_run, evaluations_fail_stale
from webapp.kernel.work import WorkStatus
from webapp.tasks import stale_work_sweep_task

pytestmark = pytest.mark.django_db


def _running(registry, *, beat_ago: float | None, started_ago: float = 3600, items: int = 0, now=None):
    row = evaluation_row(registry.candidate, registry.deployment, registry.base_version, status="running", done=0)
    now = now or timezone.now()
    row.started_at = now - timedelta(seconds=started_ago)
    row.heartbeat_at = None if beat_ago is None else now - timedelta(seconds=beat_ago)
    row.save(update_fields=["started_at", "heartbeat_at"])
    for i in range(items):
        EvaluationItem.objects.create(
            evaluation=row, position=i, key=f"k{i}", messages=[{"role": "user", "content": "hi"}]
        )
    return row


def test_a_silent_evaluation_is_failed_with_the_reason_and_an_audit_record(registry, settings):
    settings.EVALUATION_STALE_AFTER_SECONDS = 900
    now = timezone.now()
    silent = _running(registry, beat_ago=901, now=now)
    beating = _running(registry, beat_ago=899, now=now)
    never = _running(registry, beat_ago=None, started_ago=1000, now=now)

    assert sorted(evaluations_fail_stale(now=now)) == sorted([silent.pk, never.pk])

    silent.refresh_from_db()
    assert silent.status == WorkStatus.FAILED and "the worker stopped" in silent.error
    assert beating.__class__.objects.get(pk=beating.pk).status == WorkStatus.RUNNING
    event = AuditEvent.objects.get(action=AuditAction.EVALUATION_FAILED, evaluation=silent)
    assert "the worker stopped" in event.detail
    assert evaluations_fail_stale(now=now) == [], "failed once"


def test_the_periodic_training_sweep_fails_silent_evaluations(registry):
    row = _running(registry, beat_ago=86_400)
    stale_work_sweep_task()
    row.refresh_from_db()
    assert row.status == WorkStatus.FAILED


@pytest.mark.parametrize("items", [1, 3])  # the sweep during the last item, or before others
def test_a_worker_that_was_only_slow_stops_at_its_next_item_and_keeps_the_sweeps_outcome(registry, monkeypatch, items):
    row = _running(registry, beat_ago=0, items=items)
    row.status = WorkStatus.QUEUED
    row.save(update_fields=["status"])

    class Generator:
        def prepare(self, version):
            pass

        def close(self):
            pass

    ran = []

    def slow_item_run(*, item, evaluation, generator, endpoint):
        ran.append(item.position)
        item.done = True
        item.save(update_fields=["done"])
        # While this item ran, the sweep found the evaluation silent.
        evaluation.__class__.objects.filter(pk=evaluation.pk).update(heartbeat_at=timezone.now() - timedelta(days=1))
        evaluations_fail_stale()

    monkeypatch.setattr(evaluation_service, "_make_generator", lambda config: Generator())
    monkeypatch.setattr(evaluation_service, "_judge_endpoint", lambda deployment: None)
    monkeypatch.setattr(evaluation_service, "evaluation_item_run", slow_item_run)

    after = evaluation_run(evaluation_id=row.pk)

    assert ran == [0], "no item runs after the sweep failed the evaluation"
    assert after.status == WorkStatus.FAILED and "the worker stopped" in after.error
    assert not AuditEvent.objects.filter(action=AuditAction.EVALUATION_FINISHED, evaluation=row).exists()
