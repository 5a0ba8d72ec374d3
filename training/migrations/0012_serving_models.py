"""Training sets, jobs, evaluation, promotion and release point at the serving app's
deployments and versions, and this app's copies of those models leave its state (their
tables are the serving app's now, unchanged)."""

import django.db.models.deletion
from django.db import migrations, models

APPROVE = "approve_promotion"


def _approve_move(apps, *, to_promotion: bool):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    # By the time this runs, serving 0001 has relabelled the version's content type.
    version, promotion = ("serving", "modelversion"), ("training", "promotionrequest")
    (source_label, source_model), (target_label, target_model) = (
        (version, promotion) if to_promotion else (promotion, version)
    )
    perm = Permission.objects.filter(
        content_type__app_label=source_label, content_type__model=source_model, codename=APPROVE
    ).first()
    if perm is None:
        return  # a database whose permissions come after migrating
    target, _ = ContentType.objects.get_or_create(app_label=target_label, model=target_model)
    twin = Permission.objects.filter(content_type=target, codename=APPROVE).first()
    if twin is None:
        perm.content_type = target
        perm.save(update_fields=["content_type"])
        return
    twin.group_set.add(*perm.group_set.all())
    twin.user_set.add(*perm.user_set.all())
    perm.delete()


def approve_forwards(apps, schema_editor):
    """`training.approve_promotion` was a permission on ModelVersion's content type, which is
    now the serving app's: it moves, grants and all, to PromotionRequest's, so its name (and
    every `has_perm` check) stays `training.approve_promotion`."""
    _approve_move(apps, to_promotion=True)


def approve_backwards(apps, schema_editor):
    _approve_move(apps, to_promotion=False)


class Migration(migrations.Migration):
    dependencies = [
        ("feedback", "0014_serving_foreign_keys"),
        ("serving", "0001_initial"),
        ("training", "0011_evaluation_work_status"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        # State only: the tables, columns and constraints stay as they are.
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveField(
                    model_name="modelversion",
                    name="base_model",
                ),
                migrations.RemoveField(
                    model_name="liveversion",
                    name="changed_by",
                ),
                migrations.RemoveField(
                    model_name="liveversion",
                    name="deployment",
                ),
                migrations.RemoveField(
                    model_name="liveversion",
                    name="version",
                ),
                migrations.RemoveField(
                    model_name="liveversionchange",
                    name="changed_by",
                ),
                migrations.RemoveField(
                    model_name="liveversionchange",
                    name="deployment",
                ),
                migrations.RemoveField(
                    model_name="liveversionchange",
                    name="from_version",
                ),
                migrations.RemoveField(
                    model_name="liveversionchange",
                    name="to_version",
                ),
                migrations.RemoveField(
                    model_name="modelversion",
                    name="created_by",
                ),
                migrations.RemoveField(
                    model_name="modelversion",
                    name="deployment",
                ),
                migrations.RemoveField(
                    model_name="modelversion",
                    name="parent",
                ),
                migrations.AlterField(
                    model_name="trainingjob",
                    name="result_version",
                    field=models.OneToOneField(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="produced_by_job",
                        to="serving.modelversion",
                    ),
                ),
                migrations.AlterField(
                    model_name="evaluation",
                    name="baseline",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="+", to="serving.modelversion"
                    ),
                ),
                migrations.AlterField(
                    model_name="promotionrequest",
                    name="candidate",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="promotions",
                        to="serving.modelversion",
                    ),
                ),
                migrations.AlterField(
                    model_name="release",
                    name="version",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="releases", to="serving.modelversion"
                    ),
                ),
                migrations.AlterField(
                    model_name="trainingjob",
                    name="base_version",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="training_jobs",
                        to="serving.modelversion",
                    ),
                ),
                migrations.AlterField(
                    model_name="promotionrequest",
                    name="from_version",
                    field=models.ForeignKey(
                        blank=True,
                        help_text="live when asked",
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="serving.modelversion",
                    ),
                ),
                migrations.AlterField(
                    model_name="release",
                    name="from_version",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="serving.modelversion",
                    ),
                ),
                migrations.AlterField(
                    model_name="auditevent",
                    name="to_version",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="serving.modelversion",
                    ),
                ),
                migrations.AlterField(
                    model_name="evaluation",
                    name="candidate",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="evaluations",
                        to="serving.modelversion",
                    ),
                ),
                migrations.AlterField(
                    model_name="auditevent",
                    name="from_version",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="serving.modelversion",
                    ),
                ),
                migrations.AlterModelOptions(
                    name="promotionrequest",
                    options={
                        "ordering": ["-requested_at", "-id"],
                        "permissions": [("approve_promotion", "Can approve the promotion of a model version")],
                    },
                ),
                migrations.AlterField(
                    model_name="auditevent",
                    name="deployment",
                    field=models.ForeignKey(
                        blank=True,
                        help_text="blank: no deployment (an override of the settings' judge for data of none)",
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="serving.deployment",
                    ),
                ),
                migrations.AlterField(
                    model_name="evaluation",
                    name="deployment",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="evaluations", to="serving.deployment"
                    ),
                ),
                migrations.AlterField(
                    model_name="promotionrequest",
                    name="deployment",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="promotions", to="serving.deployment"
                    ),
                ),
                migrations.AlterField(
                    model_name="release",
                    name="deployment",
                    field=models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="releases", to="serving.deployment"
                    ),
                ),
                migrations.AlterField(
                    model_name="trainingjob",
                    name="deployment",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="training_jobs",
                        to="serving.deployment",
                    ),
                ),
                migrations.AlterField(
                    model_name="trainingset",
                    name="deployment",
                    field=models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="training_sets",
                        to="serving.deployment",
                    ),
                ),
                migrations.DeleteModel(
                    name="BaseModel",
                ),
                migrations.DeleteModel(
                    name="LiveVersion",
                ),
                migrations.DeleteModel(
                    name="LiveVersionChange",
                ),
                migrations.DeleteModel(
                    name="ModelVersion",
                ),
            ],
        ),
        migrations.RunPython(approve_forwards, approve_backwards),
    ]
