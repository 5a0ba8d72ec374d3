"""One audit trail for live: the pointer's own rows (`serving.LiveVersionChange`) are the record
of every move, and the audit log shows them among its events instead of a `live_switched`
event of its own (docs/decisions/0007-promotion-and-release.md, addendum).

- The moves a release or a progressive release made before now get the promotion request and
  the release behind them, read back from the reason each wrote (`promotion (release N)`,
  `rollback (release N)`, `progressive release N complete`), so the audit log and a request's
  page still link them. The `live_switched` events written until now stay in the audit log's
  table, which refuses to change or delete a row; the pages and the API show the trail's row
  for each of those moves instead.
- On PostgreSQL the trail refuses UPDATE as the audit log does, but for an account's deletion
  blanking who moved the pointer (`changed_by` is SET_NULL); a deployment's deletion takes its
  trail with it (CASCADE), so DELETE is left to the foreign key.
"""

import re

from django.db import migrations

_RELEASE = re.compile(r"^(?:promotion|rollback) \(release (\d+)\)$")
_ROLLOUT = re.compile(r"^progressive release (\d+) complete$")

TRAIL_TRIGGER = """
CREATE OR REPLACE FUNCTION training_liveversionchange_refuse_change() RETURNS trigger AS $$
BEGIN
    IF OLD.changed_by_id IS NOT NULL AND NEW.changed_by_id IS NULL
       AND (NEW.id, NEW.deployment_id, NEW.from_version_id, NEW.to_version_id, NEW.changed_at,
            NEW.reason, NEW.kind, NEW.promotion_id, NEW.release_id)
           IS NOT DISTINCT FROM
           (OLD.id, OLD.deployment_id, OLD.from_version_id, OLD.to_version_id, OLD.changed_at,
            OLD.reason, OLD.kind, OLD.promotion_id, OLD.release_id) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'the trail of live moves is append-only: % refused on training_liveversionchange', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER training_liveversionchange_append_only
    BEFORE UPDATE ON training_liveversionchange
    FOR EACH ROW EXECUTE FUNCTION training_liveversionchange_refuse_change();
"""
TRAIL_TRIGGER_DROP = """
DROP TRIGGER IF EXISTS training_liveversionchange_append_only ON training_liveversionchange;
DROP FUNCTION IF EXISTS training_liveversionchange_refuse_change();
"""


def link_moves(apps, schema_editor):
    LiveVersionChange = apps.get_model("serving", "LiveVersionChange")
    Release = apps.get_model("training", "Release")
    Rollout = apps.get_model("training", "Rollout")
    for change in LiveVersionChange.objects.exclude(reason="").only("pk", "reason"):
        links = None
        if match := _RELEASE.match(change.reason):
            release = Release.objects.filter(pk=int(match.group(1))).values("pk", "promotion_id").first()
            if release:
                links = {"release_id": release["pk"], "promotion_id": release["promotion_id"]}
        elif match := _ROLLOUT.match(change.reason):
            rollout = Rollout.objects.filter(pk=int(match.group(1))).values("release_id", "promotion_id").first()
            if rollout:
                links = rollout
        if links:
            LiveVersionChange.objects.filter(pk=change.pk).update(**links)


def trail_trigger_create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TRAIL_TRIGGER, params=None)


def trail_trigger_drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TRAIL_TRIGGER_DROP, params=None)


class Migration(migrations.Migration):
    dependencies = [
        ("serving", "0005_live_change_links"),
        ("training", "0023_progressive_release"),
    ]

    operations = [
        migrations.RunPython(link_moves, migrations.RunPython.noop),
        migrations.RunPython(trail_trigger_create, trail_trigger_drop),
    ]
