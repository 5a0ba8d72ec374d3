"""Releases joined the work-item lifecycle in migrations training 0015 and 0016. A database with a
release in each of the old statuses migrates forward to the shared statuses with the step
each had reached, keeps one active release per deployment, and migrates back again."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

# The other apps are held where they were when these ran: a later migration of theirs
# (a column the historical models do not know) would break the old rows' inserts.
OTHERS = [("serving", "0001_initial"), ("feedback", "0016_work_item_worker")]
BEFORE = [("training", "0014_learning_policies"), *OTHERS]
AFTER = [("training", "0016_release_statuses"), *OTHERS]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def statuses(apps) -> dict[str, tuple]:
    Release = apps.get_model("training", "Release")
    fields = ["status", "step"] if any(f.name == "step" for f in Release._meta.fields) else ["status"]
    return {r.reason: tuple(getattr(r, f) for f in fields) for r in Release.objects.all()}


@pytest.mark.django_db(transaction=True)
def test_releases_move_to_the_shared_statuses_with_their_step_and_back():
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    try:
        old = migrate(BEFORE)
        Deployment = old.get_model("serving", "Deployment")
        base = old.get_model("serving", "BaseModel").objects.create(name="tiny", path="/models/tiny")
        version = old.get_model("serving", "ModelVersion").objects.create(
            name="tiny", base_model=base, kind="base", path="/models/tiny"
        )
        a, b, c = (Deployment.objects.create(name=name) for name in ("a", "b", "c"))
        OldRelease = old.get_model("training", "Release")
        for deployment, status, timings in [
            (a, "queued", {}),
            (b, "loading", {"picked_up_ms": 40}),
            (c, "smoke_test", {"picked_up_ms": 40, "loaded_ms": 900}),
            (a, "live", {"picked_up_ms": 40, "loaded_ms": 900, "smoke_ms": 1200, "live_ms": 1210}),
            (b, "failed", {"picked_up_ms": 40, "loaded_ms": 900, "failed_ms": 1100}),
            (c, "failed", {"failed_ms": 600_000}),
            (a, "failed", {"picked_up_ms": 40, "loaded_ms": 900, "smoke_ms": 1200, "failed_ms": 1300}),
        ]:
            OldRelease.objects.create(
                deployment=deployment,
                version=version,
                status=status,
                timings=timings,
                reason=f"{deployment.name}-{status}",
            )

        new = migrate(AFTER)

        assert statuses(new) == {
            "a-queued": ("queued", ""),
            "b-loading": ("running", "loading"),
            "c-smoke_test": ("running", "smoke_test"),
            "a-live": ("finished", "switch"),
            "b-failed": ("failed", "smoke_test"),  # it had loaded: it failed in the smoke test
            "c-failed": ("failed", ""),
            "a-failed": ("failed", "switch"),  # its smoke test passed: it failed at the switch
        }
        Release = new.get_model("training", "Release")
        # The constraint is rebuilt on the new active statuses: a running release still blocks.
        with pytest.raises(IntegrityError), transaction.atomic():
            Release.objects.create(deployment_id=b.pk, version_id=version.pk, status="queued", reason="b-second")
        d = new.get_model("serving", "Deployment").objects.create(name="d")
        Release.objects.create(
            deployment_id=d.pk, version_id=version.pk, status="running", step="switch", reason="d-switch"
        )
        Release.objects.create(deployment_id=d.pk, version_id=version.pk, status="cancelled", reason="d-cancelled")

        old = migrate(BEFORE)

        assert statuses(old) == {
            "a-queued": ("queued",),
            "b-loading": ("loading",),
            "c-smoke_test": ("smoke_test",),
            "a-live": ("live",),
            "b-failed": ("failed",),
            "c-failed": ("failed",),
            "a-failed": ("failed",),
            # The switch commits with the end: a release still running there had not flipped.
            "d-switch": ("smoke_test",),
            "d-cancelled": ("failed",),
        }
        OldRelease = old.get_model("training", "Release")
        assert OldRelease.objects.get(reason="d-cancelled").error == "cancelled"
        with pytest.raises(IntegrityError), transaction.atomic():
            OldRelease.objects.create(deployment_id=c.pk, version_id=version.pk, status="queued", reason="c-second")
    finally:
        # Put the schema back even when an assertion failed: the tests after this one need it.
        migrate(leaves)
