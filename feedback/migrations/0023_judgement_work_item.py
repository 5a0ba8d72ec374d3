"""Judgements join the shared work lifecycle (`webapp.kernel.work.WorkItem`).

The judge call's list of requests moves from `attempts` to `call_attempts`, so that
`attempts` is the lifecycle's count of worker starts; `failure_reason` becomes the
lifecycle's `error` (the API still calls it `failure_reason`). Renames keep every row's
data; the statuses (pending, running, succeeded, failed) are unchanged. A judgement
running at upgrade has no `worker` and no heartbeat: the sweep reads its `started_at`,
as before, and fails it past the limit.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("feedback", "0022_policy_notes"),
    ]

    operations = [
        migrations.RenameField(model_name="judgeresult", old_name="attempts", new_name="call_attempts"),
        migrations.RenameField(model_name="judgeresult", old_name="failure_reason", new_name="error"),
        migrations.AddField(
            model_name="judgeresult",
            name="attempts",
            field=models.PositiveIntegerField(default=0, help_text="times a worker started or took it over"),
        ),
        migrations.AddField(
            model_name="judgeresult",
            name="cancel_requested",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="judgeresult",
            name="heartbeat_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="judgeresult",
            name="worker",
            field=models.CharField(blank=True, default="", max_length=200),
        ),
    ]
