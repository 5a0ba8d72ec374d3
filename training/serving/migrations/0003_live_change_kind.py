"""How each flip of the live pointer happened (promotion, rollback, set by a command), so a
version that was rolled back from cannot be put back without a new approved request.

Earlier flips are classified from the reason a release wrote (`promotion (release N)`,
`rollback (release N)`); every other flip was a command's."""

import re

from django.db import migrations, models

_RELEASE_REASON = re.compile(r"^(promotion|rollback) \(release \d+\)$")


def classify(apps, schema_editor):
    LiveVersionChange = apps.get_model("serving", "LiveVersionChange")
    for change in LiveVersionChange.objects.exclude(reason="").only("pk", "reason"):
        match = _RELEASE_REASON.match(change.reason)
        if match:
            LiveVersionChange.objects.filter(pk=change.pk).update(kind=match.group(1))


class Migration(migrations.Migration):
    dependencies = [
        ("serving", "0002_basemodel_inference_replicas"),
    ]

    operations = [
        migrations.AddField(
            model_name="liveversionchange",
            name="kind",
            field=models.CharField(
                choices=[
                    ("promotion", "Promotion (an approved request)"),
                    ("rollback", "Rollback"),
                    ("set", "Set by a command"),
                ],
                default="set",
                max_length=10,
            ),
        ),
        migrations.RunPython(classify, migrations.RunPython.noop),
    ]
