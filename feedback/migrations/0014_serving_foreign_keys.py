"""Traces, keys, judging and feedback point at the serving app's deployments and versions
(the same tables: only the migration state changes)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("feedback", "0013_work_status_finished_and_run_heartbeat"),
        ("serving", "0001_initial"),
    ]

    operations = [
        # State only: the tables, columns and constraints stay as they are.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="conversationtip",
                    name="deployment",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="serving.deployment",
                    ),
                ),
                migrations.AlterField(
                    model_name="deploymentjudge",
                    name="deployment",
                    field=models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="judge_endpoint",
                        serialize=False,
                        to="serving.deployment",
                    ),
                ),
                migrations.AlterField(
                    model_name="candidatescoring",
                    name="deployment",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="serving.deployment",
                    ),
                ),
                migrations.AlterField(
                    model_name="failuremoderun",
                    name="deployment",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="serving.deployment",
                    ),
                ),
                migrations.AlterField(
                    model_name="customerfeedback",
                    name="deployment",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="+", to="serving.deployment"
                    ),
                ),
                migrations.AlterField(
                    model_name="otelspan",
                    name="deployment",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="serving.deployment",
                    ),
                ),
                migrations.AlterField(
                    model_name="apikey",
                    name="deployment",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="api_keys", to="serving.deployment"
                    ),
                ),
                migrations.AlterField(
                    model_name="trace",
                    name="deployment",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="traces", to="serving.deployment"
                    ),
                ),
                migrations.AlterField(
                    model_name="judgejob",
                    name="deployment",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="serving.deployment",
                    ),
                ),
                migrations.AlterField(
                    model_name="message",
                    name="model_version",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to="serving.modelversion",
                    ),
                ),
                migrations.AlterField(
                    model_name="trace",
                    name="model_version",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="traces",
                        to="serving.modelversion",
                    ),
                ),
            ],
        ),
    ]
