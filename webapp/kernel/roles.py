"""Roles are Django groups; what each may do is the permissions listed here.

- operator: browse traces, comment, rate, correct, build and work annotation queues; build
  training sets, start and cancel training jobs; set up learning policies.
- reviewer: work annotation queues only (sees a trace while holding or having done its item).
- approver: approves model promotions (`training.approve_promotion`), reads traces and
  training jobs.
- admin: every permission of the project's apps and user management, of the accounts that
  cannot request or approve promotions: giving a role that can (operator, approver,
  admin), or changing an account that holds one, is a superuser's (`PROMOTING`), so one
  admin cannot make the second person four eyes need.

`roles_sync` creates the groups and adds missing permissions; it runs in a data migration
and after every `migrate` (a post_migrate handler), so a new permission named here reaches
existing databases. It only adds: permissions an admin granted by hand are kept.
"""

from __future__ import annotations

import logging

from django.apps import apps as global_apps

logger = logging.getLogger(__name__)

OPERATOR, REVIEWER, APPROVER, ADMIN = "operator", "reviewer", "approver", "admin"

_ANNOTATE = [
    "feedback.add_comment",
    "feedback.change_comment",
    "feedback.delete_comment",
    "feedback.add_turnrating",
    "feedback.add_correction",
]
ROLE_PERMISSIONS: dict[str, list[str]] = {
    OPERATOR: [
        "feedback.view_trace",
        "feedback.view_customerfeedback",
        *_ANNOTATE,
        "feedback.view_annotationqueue",
        "feedback.add_annotationqueue",
        "feedback.work_annotationqueue",
        # Spending judge calls: backfill batches, re-judging a turn, failure-mode runs.
        "feedback.add_judgejob",
        "feedback.add_failuremoderun",
        # Turning feedback into weights: build training sets, start and cancel jobs.
        "training.view_trainingset",
        "training.add_trainingset",
        "training.view_trainingjob",
        "training.add_trainingjob",
        "training.change_trainingjob",
    ],
    REVIEWER: [*_ANNOTATE, "feedback.view_annotationqueue", "feedback.work_annotationqueue"],
    APPROVER: [
        "training.approve_promotion",
        "feedback.view_trace",
        "serving.view_modelversion",
        "training.view_trainingjob",
    ],
    # Admins get every permission of these apps (see roles_sync) and user management.
    ADMIN: ["auth.view_user", "auth.add_user", "auth.change_user", "auth.view_group", "auth.change_group"],
}
ADMIN_APPS = ("serving", "feedback", "training")
# The permissions that request or approve a promotion: a role or account holding one is
# given or changed by a superuser only (feedback/admin.py).
PROMOTING = ("training.add_promotionrequest", "training.approve_promotion")

# Evaluation and promotion: operators evaluate candidates and request promotions; approvers
# read the same pages and decide (approve, reject, roll back: `training.approve_promotion`).
_PROMOTION_READ = [
    "serving.view_modelversion",
    "training.view_evaluation",
    "training.view_promotionrequest",
    "training.view_release",
    "training.view_auditevent",
]
# Learning policies: operators set them up (and answer for the requests they open);
# approvers read them beside the requests they decide.
_POLICIES = ["training.view_learningpolicy", "training.add_learningpolicy", "training.change_learningpolicy"]
for _role, _extra in (
    (OPERATOR, [*_PROMOTION_READ, "training.add_evaluation", "training.add_promotionrequest", *_POLICIES]),
    (APPROVER, [*_PROMOTION_READ, "training.view_learningpolicy"]),
):
    ROLE_PERMISSIONS[_role] += [p for p in _extra if p not in ROLE_PERMISSIONS[_role]]


def roles_sync(*, apps=global_apps, during_migration: bool = False) -> None:
    """Create the role groups; add missing permissions.

    In the data migration, permissions of models that later migrations create do not exist
    yet (the post_migrate run adds them), so their absence is only worth a debug line."""
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    by_name = {
        f"{app}.{codename}": pk
        for pk, app, codename in Permission.objects.values_list("pk", "content_type__app_label", "codename")
    }
    for role, names in ROLE_PERMISSIONS.items():
        group, _ = Group.objects.get_or_create(name=role)
        wanted = {by_name[n] for n in names if n in by_name}
        for missing in sorted(set(names) - set(by_name)):
            level = logging.DEBUG if during_migration else logging.WARNING
            logger.log(level, "role %s: permission %s does not exist (yet)", role, missing)
        if role == ADMIN:
            wanted |= {pk for name, pk in by_name.items() if name.split(".", 1)[0] in ADMIN_APPS}
        group.permissions.add(*wanted)


def user_roles(user) -> set[str]:
    """The role names a user holds (a superuser holds them all)."""
    if user.is_superuser:
        return set(ROLE_PERMISSIONS)
    return set(user.groups.filter(name__in=ROLE_PERMISSIONS).values_list("name", flat=True))
