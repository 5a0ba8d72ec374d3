"""Releases join the work-item lifecycle, the rows: each old status becomes a shared one
with the step it had reached, and back; the one-active-release constraint is rebuilt on
the new active statuses (queued, running)."""

from django.db import migrations, models

# Old status -> (new status, step). A live release reached the switch; a failed one's step
# is not recorded, so the timings it reached say: the last one written is the step after it
# (smoke passed: it failed at the switch; loaded: in the smoke test; picked up: loading).
FORWARD = {
    "queued": ("queued", ""),
    "loading": ("running", "loading"),
    "smoke_test": ("running", "smoke_test"),
    "live": ("finished", "switch"),
}


def statuses_forward(apps, schema_editor):
    Release = apps.get_model("training", "Release")
    for old, (status, step) in FORWARD.items():
        Release.objects.filter(status=old).update(status=status, step=step)
    failed = Release.objects.filter(status="failed", step="")
    for reached, step in (("smoke_ms", "switch"), ("loaded_ms", "smoke_test"), ("picked_up_ms", "loading")):
        failed.filter(timings__has_key=reached).update(step=step)


def statuses_back(apps, schema_editor):
    Release = apps.get_model("training", "Release")
    Release.objects.filter(status="running", step="smoke_test").update(status="smoke_test")
    # The switch commits with the end, so a release still running there had not flipped yet.
    Release.objects.filter(status="running", step="switch").update(status="smoke_test")
    Release.objects.filter(status="running").update(status="loading")
    Release.objects.filter(status="finished").update(status="live")
    # The older code has no cancelled release: it did not go live, which it calls failed.
    Release.objects.filter(status="cancelled", error="").update(error="cancelled")
    Release.objects.exclude(status__in=["queued", "loading", "smoke_test", "live"]).update(status="failed")


class Migration(migrations.Migration):
    dependencies = [
        ("training", "0015_release_work_item"),
    ]

    operations = [
        migrations.RunPython(statuses_forward, statuses_back),
        migrations.AddConstraint(
            model_name="release",
            constraint=models.UniqueConstraint(
                condition=models.Q(("status__in", ["queued", "running"])),
                fields=("deployment",),
                name="release_one_active_per_deployment",
            ),
        ),
    ]
