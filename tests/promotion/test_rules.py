"""Who may request, approve, reject and roll back, and which preconditions are named when
they do not hold (services; no inference server needed)."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied

from tests.factories import user_with_role
from tests.promotion.conftest import evaluation_row
from training.promotion.models import AuditAction, AuditEvent, PromotionStatus, Release
from training.promotion.services.promotion import (
    promotion_approve,
    promotion_approve_check,
    promotion_reject,
    promotion_request_create,
    promotion_withdraw,
)
from training.promotion.services.promotion_checks import PromotionRefused
from training.promotion.services.release import release_run
from training.promotion.services.rollback import rollback_request, rollback_target
from training.serving.models import LiveVersion, LiveVersionChange
from webapp.kernel.work import WorkStatus


def request(registry, user, evaluation, **kwargs):
    return promotion_request_create(
        candidate=registry.candidate,
        deployment=registry.deployment,
        evaluation=evaluation,
        requested_by=user,
        note="fixes refunds",
        **kwargs,
    )


def test_a_requester_cannot_approve_their_own_request(registry, approving_operator, approver):
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    promotion = request(registry, approving_operator, evaluation)
    with pytest.raises(PermissionDenied, match="another approver must decide"):
        promotion_approve(promotion=promotion, user=approving_operator)
    with pytest.raises(PermissionDenied, match="another approver"):
        promotion_reject(promotion=promotion, user=approving_operator, comment="no")
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.PENDING
    assert not Release.objects.exists()

    release = promotion_approve(promotion=promotion, user=approver, comment="numbers look right")
    promotion.refresh_from_db()
    assert (promotion.status, promotion.decided_by, promotion.decision_comment) == (
        PromotionStatus.APPROVED,
        approver,
        "numbers look right",
    )
    assert (release.status, release.version, release.from_version) == (
        WorkStatus.QUEUED,
        registry.candidate,
        registry.base_version,
    )
    # Nothing changes what customers get until the release has run.
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version


def test_an_operator_without_the_approve_permission_is_refused(registry, operator, approver):
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    promotion = request(registry, operator, evaluation)
    other_operator = user_with_role("operator", "otto")
    with pytest.raises(PermissionDenied, match=r"training\.approve_promotion"):
        promotion_approve(promotion=promotion, user=other_operator)
    with pytest.raises(PermissionDenied, match=r"training\.add_promotionrequest"):
        request(registry, approver, evaluation)


def test_an_unfinished_evaluation_is_named_and_blocks_approval(registry, operator, approver):
    evaluation = evaluation_row(
        registry.candidate, registry.deployment, registry.base_version, status="running", done=1
    )
    promotion = request(registry, operator, evaluation)  # asking early is fine
    with pytest.raises(PromotionRefused, match=r"evaluation \d+ is not finished \(running, 1/4 items\)") as refused:
        promotion_approve(promotion=promotion, user=approver)
    assert refused.value.field == "evaluation"
    checks = {c.code: c for c in promotion_approve_check(promotion=promotion, user=approver)}
    assert not checks["evaluation"].ok and checks["four_eyes"].ok and checks["permission"].ok
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.PENDING


def test_a_request_needs_an_evaluation_that_can_still_finish(registry, operator):
    with pytest.raises(PromotionRefused, match="evaluate smol-v1 against the live version first"):
        request(registry, operator, None)
    failed = evaluation_row(registry.candidate, registry.deployment, registry.base_version, status="failed")
    with pytest.raises(PromotionRefused, match="failed: run a new one"):
        request(registry, operator, failed)


def test_an_evaluation_against_an_older_live_version_is_refused(registry, operator, approver, tmp_path):
    from tests.promotion.conftest import make_adapter_folder
    from training.serving.services import live_version_set, model_version_create

    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    promotion = request(registry, operator, evaluation)
    hotfix = model_version_create(
        name="smol-hotfix",
        base_model=registry.base,
        kind="lora",
        path=make_adapter_folder(tmp_path / "hotfix"),
        parent=registry.base_version,
    )
    live_version_set(deployment=registry.deployment, version=hotfix)
    with pytest.raises(PromotionRefused, match="compared against smol, but smol-hotfix is live now"):
        promotion_approve(promotion=promotion, user=approver)


def test_a_candidate_outside_the_live_lineage_needs_an_explicit_rebase(registry, operator, approver, tmp_path):
    from tests.promotion.conftest import make_adapter_folder
    from training.serving.services import live_version_set, model_version_create

    sibling = model_version_create(
        name="smol-sibling",
        base_model=registry.base,
        kind="lora",
        path=make_adapter_folder(tmp_path / "sib"),
        parent=registry.base_version,
    )
    live_version_set(deployment=registry.deployment, version=sibling)
    evaluation = evaluation_row(registry.candidate, registry.deployment, sibling)
    with pytest.raises(PromotionRefused, match="not built from the live version smol-sibling") as refused:
        request(registry, operator, evaluation)
    assert refused.value.field == "rebase_reason"
    promotion = request(registry, operator, evaluation, rebase_reason="sibling was a stopgap; v1 supersedes it")
    checks = {c.code: c for c in promotion_approve_check(promotion=promotion, user=approver)}
    assert checks["lineage"].ok and "rebased explicitly" in checks["lineage"].detail


def test_full_checkpoints_are_refused_with_the_way_to_serve_them(registry, operator, tmp_path):
    from training.serving.services import model_version_create

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "config.json").write_text("{}")
    full = model_version_create(
        name="smol-full", base_model=registry.base, kind="full", path=tmp_path / "full", parent=registry.base_version
    )
    evaluation = evaluation_row(full, registry.deployment, registry.base_version)
    with pytest.raises(PromotionRefused, match=r"full checkpoint.*serve_inference --base"):
        promotion_request_create(
            candidate=full, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
        )


def test_reject_needs_a_comment_and_withdraw_is_the_requesters(registry, operator, approver):
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    promotion = request(registry, operator, evaluation)
    with pytest.raises(PromotionRefused, match="say why"):
        promotion_reject(promotion=promotion, user=approver, comment="  ")
    with pytest.raises(PermissionDenied):
        promotion_withdraw(promotion=promotion, user=approver)
    promotion_reject(promotion=promotion, user=approver, comment="win rate CI includes 0.5")
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.REJECTED
    with pytest.raises(PromotionRefused, match="rejected"):
        promotion_approve(promotion=promotion, user=approver)
    # One waiting request per candidate and deployment; a new one after a decision is fine.
    again = request(registry, operator, evaluation)
    with pytest.raises(PromotionRefused, match="already has a promotion request waiting"):
        request(registry, operator, evaluation)
    promotion_withdraw(promotion=again, user=operator)
    actions = list(AuditEvent.objects.order_by("id").values_list("action", "actor_name"))
    assert actions == [
        (AuditAction.PROMOTION_REQUESTED, "olga"),
        (AuditAction.PROMOTION_REJECTED, "arno"),
        (AuditAction.PROMOTION_REQUESTED, "olga"),
        (AuditAction.PROMOTION_WITHDRAWN, "olga"),
    ]


def test_a_release_whose_weights_cannot_load_leaves_the_old_version_live(registry, operator, approver):
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    promotion = request(registry, operator, evaluation)
    release = promotion_approve(promotion=promotion, user=approver)

    release = release_run(release_id=release.pk)  # the server at inference_url is down

    assert release.status == WorkStatus.FAILED
    assert "loading smol-v1 into the inference server failed" in release.error
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.FAILED
    failed = AuditEvent.objects.get(action=AuditAction.RELEASE_FAILED)
    assert (failed.from_version, failed.to_version, failed.release) == (
        registry.base_version,
        registry.candidate,
        release,
    )
    # A redelivered task finds the release finished and does nothing.
    assert release_run(release_id=release.pk).status == WorkStatus.FAILED
    assert AuditEvent.objects.filter(action=AuditAction.RELEASE_FAILED).count() == 1


def test_rollback_needs_an_approver_and_a_previous_version(registry, operator, approver):
    with pytest.raises(PermissionDenied):
        rollback_request(deployment=registry.deployment, user=operator)
    with pytest.raises(PromotionRefused, match="no earlier live version"):
        rollback_request(deployment=registry.deployment, user=approver)
    from training.serving.services import live_version_set

    live_version_set(deployment=registry.deployment, version=registry.candidate)
    assert rollback_target(deployment=registry.deployment) == registry.base_version
    release = rollback_request(deployment=registry.deployment, user=approver, reason="refund answers regressed")
    assert (release.kind, release.version, release.from_version) == (
        "rollback",
        registry.base_version,
        registry.candidate,
    )
    with pytest.raises(PromotionRefused, match="in progress"):
        rollback_request(deployment=registry.deployment, user=approver)


def test_an_adapter_with_non_finite_weights_is_refused_before_it_reaches_the_server(
    registry, operator, approver, tmp_path
):
    from tests.promotion.conftest import make_adapter_folder
    from training.serving.services import model_version_create

    diverged = model_version_create(
        name="smol-diverged",
        base_model=registry.base,
        kind="lora",
        path=make_adapter_folder(tmp_path / "diverged", poison=True),
        parent=registry.base_version,
    )
    evaluation = evaluation_row(diverged, registry.deployment, registry.base_version)
    promotion = promotion_request_create(
        candidate=diverged, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
    )
    release = release_run(release_id=promotion_approve(promotion=promotion, user=approver).pk)
    assert release.status == WorkStatus.FAILED
    assert "smol-diverged was not loaded: adapter_model.safetensors: 1 tensors hold NaN" in release.error
    assert "lora_B" in release.error
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version


def test_a_monitor_breach_of_the_training_job_needs_a_reason_to_override(registry, operator, approver):
    from training.models import TrainingJob

    breach = {"monitor": "length", "value": 2.1, "limit": 1.15, "message": "mean length 2.1x the starting model's"}
    TrainingJob.objects.create(
        kind="grpo",
        status="finished",
        config={},
        base_version=registry.base_version,
        result_version=registry.candidate,
        flagged=True,
        breaches=[breach],
    )
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    with pytest.raises(PromotionRefused, match=r"breached a monitor \(mean length 2\.1x") as refused:
        request(registry, operator, evaluation)
    assert refused.value.field == "breach_override_reason"

    promotion = request(registry, operator, evaluation, breach_override_reason="longer answers carry tracking links")
    assert promotion.snapshot["monitors"]["breaches"] == [breach]
    checks = {c.code: c for c in promotion_approve_check(promotion=promotion, user=approver)}
    assert checks["monitors"].ok and "longer answers carry tracking links" in checks["monitors"].detail
    promotion_approve(promotion=promotion, user=approver)
    requested = AuditEvent.objects.get(action=AuditAction.PROMOTION_REQUESTED)
    assert requested.data == {"breach_override_reason": "longer answers carry tracking links"}


def test_an_evaluation_takes_the_held_out_items_of_a_training_set(registry, operator):
    from training.models import TrainingItem
    from training.promotion.services.evaluation import evaluation_create
    from training.services.training_sets import training_set_create

    items = [
        {"key": f"turn-{i}", "messages": [{"role": "user", "content": f"question {i}"}], "rubric": {"criteria": [
            {"criterion": "answers the question", "weight": 2}]}}
        for i in range(12)
    ] + [
        {"key": f"task-{i}", "kind": "task", "messages": [{"role": "user", "content": f"2+{i}?"}], "grader": "number",
         "reference": str(2 + i)}
        for i in range(12)
    ]  # fmt: skip
    training_set = training_set_create(
        name="refunds", items=items, deployment=registry.deployment, heldout_fraction=0.3
    )
    heldout = list(TrainingItem.objects.filter(training_set=training_set, split="heldout").order_by("id"))
    assert 0 < len(heldout) < len(items)

    evaluation = evaluation_create(
        candidate=registry.candidate, deployment=registry.deployment, training_set=training_set, created_by=operator
    )
    stored = list(evaluation.items.order_by("position"))
    assert [i.key for i in stored] == [h.key for h in heldout]
    assert evaluation.training_set == training_set and evaluation.total == len(heldout)
    for item, source in zip(stored, heldout, strict=True):
        assert (item.kind, item.grader, item.reference, item.rubric) == (
            source.kind,
            source.grader,
            source.reference,
            source.rubric,
        )
        assert item.source["training_item"] == source.pk


def test_a_release_no_worker_finished_does_not_block_the_next_one_forever(registry, operator, approver):
    from datetime import timedelta

    from django.utils import timezone

    from training.serving.services import live_version_set

    live_version_set(deployment=registry.deployment, version=registry.candidate)
    stuck = rollback_request(deployment=registry.deployment, user=approver)
    with pytest.raises(PromotionRefused, match=f"release {stuck.pk} is in progress"):
        rollback_request(deployment=registry.deployment, user=approver)

    Release.objects.filter(pk=stuck.pk).update(created_at=timezone.now() - timedelta(minutes=11))
    again = rollback_request(deployment=registry.deployment, user=approver)

    stuck.refresh_from_db()
    assert stuck.status == WorkStatus.FAILED
    assert "not picked up within 600 s: is a worker consuming the deploy queue?" in stuck.error
    assert again.status == WorkStatus.QUEUED
    assert release_run(release_id=stuck.pk).status == WorkStatus.FAILED  # a late worker does nothing


def test_a_worker_that_resumes_after_its_release_was_failed_as_stale_does_not_take_it_live(
    registry, approver, monkeypatch
):
    from datetime import timedelta

    from django.utils import timezone

    import training.promotion.services.release as release_service
    from training.promotion.services.release import releases_fail_stale
    from training.serving.services import live_version_set

    live_version_set(deployment=registry.deployment, version=registry.candidate)
    release = rollback_request(deployment=registry.deployment, user=approver)

    def load_that_stalls_past_the_sweep(version):
        # The load takes so long that the release is failed as stale meanwhile; then it succeeds.
        silent_since = timezone.now() - timedelta(minutes=11)
        Release.objects.filter(pk=release.pk).update(started_at=silent_since, heartbeat_at=silent_since)
        assert releases_fail_stale() == 1
        return {"loaded": version.name}

    monkeypatch.setattr(release_service, "release_load", load_that_stalls_past_the_sweep)
    monkeypatch.setattr(release_service, "release_smoke", lambda version: {"tokens": 1})

    late = release_run(release_id=release.pk)
    assert late.status == WorkStatus.FAILED
    assert "no sign of the release's worker for 660 s (the limit is 600 s)" in late.error
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.candidate
    late_actions = [AuditAction.RELEASE_LOADED, AuditAction.RELEASE_SMOKE_PASSED]
    assert not AuditEvent.objects.filter(release=release, action__in=late_actions).exists()
    assert not LiveVersionChange.objects.filter(release_id=release.pk).exists()
