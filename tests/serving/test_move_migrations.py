"""The serving app took over deployments, base models, versions and live pointers from
`feedback` and `training` in migration state only. A database at the schema before the move,
with rows in it, migrates forward with every row, foreign key, permission grant and admin
history entry reachable through the new models, and migrates back again."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from feedback.models import Message, Trace
from training.serving.models import BaseModel, Deployment, LiveVersion, LiveVersionChange, ModelVersion

BEFORE = [
    ("serving", None),
    ("feedback", "0013_work_status_finished_and_run_heartbeat"),
    ("training", "0011_evaluation_work_status"),
    ("admin", "0003_logentry_add_action_flag_choices"),
]
MOVED = {"deployment", "basemodel", "modelversion", "liveversion", "liveversionchange"}
BORN_IN_SERVING = {"canarysplit"}  # models the serving app added after the move


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state([t for t in targets if t[1] is not None]).apps


def grants(group) -> list[str]:
    return sorted(f"{p.content_type.app_label}.{p.codename}" for p in group.permissions.all())


@pytest.mark.django_db(transaction=True)
def test_a_database_at_the_old_schema_moves_to_serving_with_its_rows_and_grants_and_back():
    leaves = MigrationExecutor(connection).loader.graph.leaf_nodes()
    old = migrate(BEFORE)
    OldPermission, OldGroup = old.get_model("auth", "Permission"), old.get_model("auth", "Group")

    def perm(label: str, codename: str):
        return OldPermission.objects.get(content_type__app_label=label, codename=codename)

    user = old.get_model("auth", "User").objects.create(username="olga")
    deployment = old.get_model("feedback", "Deployment").objects.create(name="support-bot")
    base = old.get_model("training", "BaseModel").objects.create(name="tiny", path="/models/tiny")
    version = old.get_model("training", "ModelVersion").objects.create(
        name="tiny", base_model=base, kind="base", path="/models/tiny", deployment=deployment, status="live"
    )
    old.get_model("training", "LiveVersion").objects.create(deployment=deployment, version=version)
    old.get_model("training", "LiveVersionChange").objects.create(deployment=deployment, to_version=version)
    trace = old.get_model("feedback", "Trace").objects.create(
        deployment=deployment, external_id="t-1", model_version=version
    )
    message = old.get_model("feedback", "Message").objects.create(
        trace=trace, position=0, role="assistant", model_version=version
    )
    group = OldGroup.objects.create(name="release-managers")
    group.permissions.add(
        perm("feedback", "change_deployment"),
        perm("training", "approve_promotion"),
        perm("training", "view_liveversion"),
    )
    user.groups.add(group)
    user.user_permissions.add(perm("training", "view_modelversion"))
    deployment_ct = old.get_model("contenttypes", "ContentType").objects.get(app_label="feedback", model="deployment")
    old.get_model("admin", "LogEntry").objects.create(
        user_id=user.pk,
        content_type_id=deployment_ct.pk,
        object_id=str(deployment.pk),
        object_repr="support-bot",
        action_flag=2,
    )
    content_types = ContentType.objects.count()

    migrate(leaves)

    assert ContentType.objects.count() == content_types  # relabelled, none made twice
    assert {ct.model for ct in ContentType.objects.filter(app_label="serving")} == MOVED | BORN_IN_SERVING
    assert not ContentType.objects.filter(model__in=MOVED).exclude(app_label="serving").exists()
    live = Deployment.objects.get(name="support-bot").live
    assert (live.version.name, live.version.base_model, live.version.deployment_id) == (
        "tiny",
        BaseModel.objects.get(name="tiny"),
        deployment.pk,
    )
    assert LiveVersionChange.objects.get().to_version == ModelVersion.objects.get(name="tiny")
    assert Trace.objects.get(pk=trace.pk).model_version.name == "tiny"
    assert Message.objects.get(pk=message.pk).model_version_id == version.pk
    assert list(ModelVersion.objects.get(pk=version.pk).traces.all()) == [Trace.objects.get(pk=trace.pk)]
    assert LiveVersion.objects.get(deployment_id=deployment.pk).version_id == version.pk
    assert grants(Group.objects.get(name="release-managers")) == [
        "serving.change_deployment",
        "serving.view_liveversion",
        "training.approve_promotion",
    ]
    olga = User.objects.get(username="olga")
    assert olga.has_perm("serving.view_modelversion") and olga.has_perm("training.approve_promotion")
    assert olga.has_perm("serving.change_deployment") and not olga.has_perm("serving.delete_deployment")
    assert LogEntry.objects.get().get_edited_object() == Deployment.objects.get(name="support-bot")
    assert Permission.objects.get(codename="approve_promotion").content_type.model == "promotionrequest"

    old = migrate(BEFORE)

    back = old.get_model("auth", "Group").objects.get(name="release-managers")
    assert grants(back) == ["feedback.change_deployment", "training.approve_promotion", "training.view_liveversion"]
    assert old.get_model("feedback", "Trace").objects.get(pk=trace.pk).model_version_id == version.pk
    # The moved models' content types went back; those of models born in serving later stay
    # behind as stale rows, as Django leaves any model's on migrating back.
    serving_types = old.get_model("contenttypes", "ContentType").objects.filter(app_label="serving")
    assert not serving_types.exclude(model__in=BORN_IN_SERVING).exists()
    migrate(leaves)
