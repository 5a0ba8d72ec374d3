"""A version that was rolled back from stays out of service until a new request for it is
approved by another person: a second rollback does not put it back (it goes further back,
to the last version a promotion replaced, or is refused), and neither do `set_live`, the
registry's `live_version_set` or a request that was made before the rollback."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.promotion.conftest import evaluation_row, make_adapter_folder
from tests.promotion.test_release_lifecycle import server_that_works  # noqa: F401 (a fixture)
from training.promotion.models import AuditAction, AuditEvent, PromotionStatus, Release
from training.promotion.services.promotion import promotion_approve, promotion_request_create
from training.promotion.services.promotion_checks import PromotionRefused
from training.promotion.services.release import release_run
from training.promotion.services.rollback import rollback_target
from training.serving.models import LiveVersion
from training.serving.services import ModelRegistryError, live_version_set, model_version_create
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.usefixtures("server_that_works")


def live(registry):
    return LiveVersion.objects.select_related("version").get(deployment=registry.deployment).version


def promote(client, registry, operator, approver, candidate) -> dict:
    """Request (operator) and approve (approver) through the API, then run the release."""
    evaluation = evaluation_row(candidate, registry.deployment, live(registry))
    client.force_login(operator)
    asked = client.post(
        "/api/v1/promotions",
        {"candidate": candidate.name, "deployment": registry.deployment.name, "evaluation": evaluation.pk},
        content_type="application/json",
    )
    assert asked.status_code == 201, asked.json()
    client.force_login(approver)
    approved = client.post(f"/api/v1/promotions/{asked.json()['id']}/approve", {}, "application/json")
    assert approved.status_code == 202, approved.json()
    assert release_run(release_id=approved.json()["id"]).status == WorkStatus.FINISHED
    return asked.json()


def rollback(client, registry, approver):
    client.force_login(approver)
    return client.post(f"/api/v1/deployments/{registry.deployment.name}/rollback", {}, "application/json")


def test_a_rollback_of_a_rollback_does_not_put_the_pulled_version_back(client, registry, operator, approver):
    v1 = registry.candidate
    promotion = promote(client, registry, operator, approver, v1)
    assert live(registry) == v1

    first = rollback(client, registry, approver)
    assert first.status_code == 202, first.json()
    assert release_run(release_id=first.json()["id"]).status == WorkStatus.FINISHED
    assert live(registry) == registry.base_version

    # The sequence: the same approver asks for a rollback again.
    again = rollback(client, registry, approver)
    assert again.status_code == 409, again.json()
    body = again.json()
    assert body["errors"][0]["field"] == "deployment"
    assert "no earlier version to return to" in body["detail"] and "smol-v1 was rolled back from" in body["detail"]
    assert live(registry) == registry.base_version
    assert Release.objects.count() == 2  # the promotion's and the first rollback's: nothing queued
    assert not AuditEvent.objects.filter(action=AuditAction.ROLLBACK_REQUESTED).exclude(release_id=first.json()["id"])

    # Nor does the old request (rolled back) or the command line bring it back...
    client.force_login(operator)
    assert client.get(f"/api/v1/promotions/{promotion['id']}").json()["status"] == PromotionStatus.ROLLED_BACK
    with pytest.raises(CommandError, match=r"smol-v1 was rolled back from .*new promotion request"):
        call_command("set_live", registry.deployment.name, v1.name, "--no-load")
    with pytest.raises(ModelRegistryError, match="rolled back from"):
        live_version_set(deployment=registry.deployment, version=v1, reason="by hand")
    assert live(registry) == registry.base_version

    # ... a new request, approved by another person, does.
    promote(client, registry, operator, approver, v1)
    assert live(registry) == v1
    assert rollback_target(deployment=registry.deployment) == registry.base_version


def test_a_second_rollback_goes_back_past_the_pulled_version(client, registry, operator, approver, tmp_path):
    v1 = registry.candidate
    v2 = model_version_create(
        name="smol-v2", base_model=registry.base, kind="lora", path=make_adapter_folder(tmp_path / "v2"), parent=v1
    )
    promote(client, registry, operator, approver, v1)
    promote(client, registry, operator, approver, v2)
    assert rollback_target(deployment=registry.deployment) == v1

    first = rollback(client, registry, approver)
    release_run(release_id=first.json()["id"])
    assert live(registry) == v1
    # v2 was pulled; the version before v1 was replaced by a promotion, not pulled: back to it.
    assert rollback_target(deployment=registry.deployment) == registry.base_version
    second = rollback(client, registry, approver)
    assert second.status_code == 202, second.json()
    assert second.json()["version"] == registry.base_version.name
    release_run(release_id=second.json()["id"])
    assert live(registry) == registry.base_version
    assert rollback(client, registry, approver).status_code == 409


def test_set_live_back_to_an_earlier_version_pulls_the_one_it_replaces(client, registry, operator, approver):
    """A rollback by hand (`set_live` to a version that was live before) withdraws the
    version it replaces just as a rollback does."""
    v1 = registry.candidate
    promote(client, registry, operator, approver, v1)
    call_command("set_live", registry.deployment.name, registry.base_version.name, "--no-load")
    assert live(registry) == registry.base_version
    assert rollback_target(deployment=registry.deployment) is None
    assert rollback(client, registry, approver).status_code == 409


def test_a_request_made_before_the_rollback_cannot_be_approved_after_it(registry, operator, approver, second_approver):
    v1 = registry.candidate
    evaluation = evaluation_row(v1, registry.deployment, registry.base_version)
    first = promotion_request_create(
        candidate=v1, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
    )
    release_run(release_id=promotion_approve(promotion=first, user=approver).pk)
    # A second request for the same version, made while it was live elsewhere in the history
    # (here: stored directly, as one made before the rollback would be).
    stale = first.__class__.objects.create(
        deployment=registry.deployment,
        candidate=v1,
        from_version=registry.base_version,
        evaluation=evaluation_row(v1, registry.deployment, registry.base_version),
        requested_by=operator,
        requested_at=first.requested_at,
    )
    from training.promotion.services.rollback import rollback_request

    release_run(release_id=rollback_request(deployment=registry.deployment, user=approver).pk)
    assert live(registry) == registry.base_version
    with pytest.raises(PromotionRefused, match=r"rolled back from .* after this request was made") as refused:
        promotion_approve(promotion=stale, user=second_approver)
    assert refused.value.code == "withdrawn"
    stale.refresh_from_db()
    assert stale.status == PromotionStatus.PENDING
