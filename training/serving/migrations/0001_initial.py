"""Deployments, base models, versions and live pointers, moved here from `feedback` and
`training` without touching their tables (docs/decisions/0020-domains-and-layers.md)."""

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

# The moved models' content types, relabelled in place, so the permissions granted on them
# (`view_modelversion`, …) and the admin's history of them keep pointing at them.
MOVED = [
    ("feedback", "deployment"),
    ("training", "basemodel"),
    ("training", "modelversion"),
    ("training", "liveversion"),
    ("training", "liveversionchange"),
]


def _relabel(apps, pairs):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    LogEntry = apps.get_model("admin", "LogEntry")
    for (old_label, new_label), model in pairs:
        old = ContentType.objects.filter(app_label=old_label, model=model).first()
        if old is None:
            continue  # a database that never made it (content types come after migrating)
        new = ContentType.objects.filter(app_label=new_label, model=model).first()
        if new is None:
            old.app_label = new_label
            old.save(update_fields=["app_label"])
            continue
        # Both exist (the new one made by a post_migrate run in between): keep the new one,
        # carrying over the grants of the old one's permissions and its admin history.
        for perm in Permission.objects.filter(content_type=old):
            twin = Permission.objects.filter(content_type=new, codename=perm.codename).first()
            if twin is None:
                perm.content_type = new
                perm.save(update_fields=["content_type"])
                continue
            twin.group_set.add(*perm.group_set.all())
            twin.user_set.add(*perm.user_set.all())
            perm.delete()
        LogEntry.objects.filter(content_type=old).update(content_type=new)
        old.delete()


def content_types_forwards(apps, schema_editor):
    _relabel(apps, [((label, "serving"), model) for label, model in MOVED])


def content_types_backwards(apps, schema_editor):
    _relabel(apps, [(("serving", label), model) for label, model in MOVED])


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
        # The schema as it was before this app: its tables are the ones these models take over.
        ("feedback", "0013_work_status_finished_and_run_heartbeat"),
        ("training", "0011_evaluation_work_status"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("admin", "0003_logentry_add_action_flag_choices"),
    ]

    operations = [
        # State only: the tables, columns and constraints stay as they are.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="BaseModel",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.SlugField(max_length=100, unique=True)),
                        ("path", models.CharField(max_length=500)),
                        ("description", models.TextField(blank=True)),
                        ("metadata", models.JSONField(blank=True, default=dict)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        (
                            "inference_url",
                            models.CharField(
                                blank=True,
                                default="",
                                help_text="The inference server serving this base model (and its adapters); blank: the default one.",
                                max_length=300,
                            ),
                        ),
                    ],
                    options={
                        "db_table": "training_basemodel",
                        "ordering": ["name"],
                    },
                ),
                migrations.CreateModel(
                    name="Deployment",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.SlugField(max_length=100, unique=True)),
                        ("description", models.TextField(blank=True)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        (
                            "stitch_conversations",
                            models.BooleanField(
                                default=True,
                                help_text="Join gateway calls that send no trace id into conversations by their message history.",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "feedback_deployment",
                        "ordering": ["name"],
                    },
                ),
                migrations.CreateModel(
                    name="ModelVersion",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("name", models.SlugField(max_length=120, unique=True)),
                        (
                            "kind",
                            models.CharField(
                                choices=[
                                    ("base", "Base weights"),
                                    ("lora", "LoRA adapter"),
                                    ("full", "Full checkpoint"),
                                ],
                                max_length=10,
                            ),
                        ),
                        ("path", models.CharField(max_length=500)),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("candidate", "Candidate"),
                                    ("approved", "Approved"),
                                    ("live", "Live"),
                                    ("retired", "Retired"),
                                    ("failed", "Failed"),
                                ],
                                default="candidate",
                                max_length=20,
                            ),
                        ),
                        ("metadata", models.JSONField(blank=True, default=dict)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        (
                            "base_model",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="versions",
                                to="serving.basemodel",
                            ),
                        ),
                        (
                            "created_by",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "deployment",
                            models.ForeignKey(
                                blank=True,
                                help_text="The deployment whose data this version was trained for, if any.",
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="model_versions",
                                to="serving.deployment",
                            ),
                        ),
                        (
                            "parent",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="children",
                                to="serving.modelversion",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "training_modelversion",
                        "ordering": ["-created_at", "-id"],
                    },
                ),
                migrations.CreateModel(
                    name="LiveVersion",
                    fields=[
                        (
                            "deployment",
                            models.OneToOneField(
                                on_delete=django.db.models.deletion.CASCADE,
                                primary_key=True,
                                related_name="live",
                                serialize=False,
                                to="serving.deployment",
                            ),
                        ),
                        ("changed_at", models.DateTimeField(default=django.utils.timezone.now)),
                        (
                            "changed_by",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "version",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="live_for",
                                to="serving.modelversion",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "training_liveversion",
                    },
                ),
                migrations.CreateModel(
                    name="LiveVersionChange",
                    fields=[
                        (
                            "id",
                            models.BigAutoField(
                                auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                            ),
                        ),
                        ("changed_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("reason", models.CharField(blank=True, default="", max_length=300)),
                        (
                            "changed_by",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to=settings.AUTH_USER_MODEL,
                            ),
                        ),
                        (
                            "deployment",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="live_changes",
                                to="serving.deployment",
                            ),
                        ),
                        (
                            "from_version",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="serving.modelversion",
                            ),
                        ),
                        (
                            "to_version",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT, related_name="+", to="serving.modelversion"
                            ),
                        ),
                    ],
                    options={
                        "db_table": "training_liveversionchange",
                        "ordering": ["-changed_at", "-id"],
                        "indexes": [models.Index(fields=["deployment", "-changed_at"], name="live_change_dep_idx")],
                    },
                ),
            ],
        ),
        migrations.RunPython(content_types_forwards, content_types_backwards),
    ]
