"""Migrations serving 0005 and training 0024 make the pointer's trail the one record of live
moves. A database with moves a release, a rollback, a progressive release and a command made,
and the `live_switched` audit events written beside them, migrates forward with each move
linked to the request and release behind it, the audit log showing one entry per move, and
migrates back again."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("training", "0023_progressive_release"), ("serving", "0004_canary_split")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_the_moves_made_before_get_their_request_and_release_and_show_once_in_the_audit_log():
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        old = migrate(BEFORE)
        person = old.get_model("auth", "User").objects.create(username="arno")
        deployment = old.get_model("serving", "Deployment").objects.create(name="bot")
        base = old.get_model("serving", "BaseModel").objects.create(name="tiny", path="/models/tiny")
        Version = old.get_model("serving", "ModelVersion")
        v0 = Version.objects.create(name="tiny", base_model=base, kind="base", path="/models/tiny")
        v1 = Version.objects.create(name="tiny-v1", base_model=base, kind="lora", path="/models/v1", parent=v0)
        evaluation = old.get_model("training", "Evaluation").objects.create(
            deployment=deployment, candidate=v1, baseline=v0
        )
        Promotion = old.get_model("training", "PromotionRequest")
        first, second = (
            Promotion.objects.create(
                deployment=deployment, candidate=v1, evaluation=evaluation, requested_by=person, status=status
            )
            for status in ("rolled_back", "deployed")
        )
        Release = old.get_model("training", "Release")
        promoted, back, stepped = (
            Release.objects.create(
                deployment=deployment,
                version=version,
                kind=kind,
                promotion=promotion,
                requested_by=person,
                status="finished",
                step="switch",
            )
            for version, kind, promotion in (
                (v1, "promotion", first),
                (v0, "rollback", first),
                (v1, "promotion", second),
            )
        )
        rollout = old.get_model("training", "Rollout").objects.create(
            deployment=deployment, candidate=v1, baseline=v0, promotion=second, release=stepped, plan={}
        )
        Change = old.get_model("serving", "LiveVersionChange")
        Event = old.get_model("training", "AuditEvent")
        for before, after, kind, reason, promotion in (
            (None, v0, "set", "make demo", None),
            (v0, v1, "promotion", f"promotion (release {promoted.pk})", first),
            (v1, v0, "rollback", f"rollback (release {back.pk})", first),
            (v0, v1, "promotion", f"progressive release {rollout.pk} complete", second),
        ):
            Change.objects.create(
                deployment=deployment,
                from_version=before,
                to_version=after,
                kind=kind,
                reason=reason,
                changed_by=person,
            )
            if promotion is not None:  # what a release or a rollout wrote beside the move until now
                Event.objects.create(
                    action="live_switched",
                    deployment=deployment,
                    actor=person,
                    actor_name="arno",
                    from_version=before,
                    to_version=after,
                    promotion=promotion,
                )

        migrate(leaves)

        from training.promotion.selectors import audit_trail
        from training.serving.models import Deployment, LiveVersionChange

        links = list(LiveVersionChange.objects.order_by("id").values_list("promotion_id", "release_id"))
        assert links == [
            (None, None),
            (first.pk, promoted.pk),
            (first.pk, back.pk),
            (second.pk, stepped.pk),
        ]
        # The events written beside the moves stay in their table; the log shows each move once.
        entries = audit_trail(deployment=Deployment.objects.get(name="bot"))
        assert [(e.action, e.pk) for e in entries] == [("live_switched", None)] * 4
        assert [e.detail for e in entries][::-1] == [
            "make demo",
            f"promotion (release {promoted.pk})",
            f"rollback (release {back.pk})",
            f"progressive release {rollout.pk} complete",
        ]

        old = migrate(BEFORE)
        assert old.get_model("serving", "LiveVersionChange").objects.count() == 4
    finally:
        # Put the schema back even when an assertion failed: the tests after this one need it.
        migrate(leaves)
