"""Roles are Django groups; what each may do in an app, that app declares. This module
holds the roles' names and the mechanism, and names no app's permission.

- operator: works the feedback and turns it into models.
- reviewer: works annotation queues only.
- approver: decides what goes live, reading what the decision rests on.
- admin: every permission of the apps that declare roles, and user management; but not the
  accounts that can request or approve promotions: giving a role that can, or changing an
  account that holds one, is a superuser's (an app's `superuser_only` permissions), so one
  admin cannot make the second person four eyes need.

An app declares its roles on its `AppConfig`, naming permissions of its own models:

    class QueuesConfig(AppConfig):
        label = "queues"
        roles = AppRoles(grants={REVIEWER: ["queues.work_queue"], OPERATOR: [...]})

`roles_sync` creates the groups and adds missing permissions; it runs in a data migration
and after every `migrate` (a post_migrate handler), so a permission an app newly declares
reaches existing databases. It only adds: permissions an admin granted by hand are kept.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from django.apps import apps as global_apps
from django.core.exceptions import ImproperlyConfigured

logger = logging.getLogger(__name__)

OPERATOR, REVIEWER, APPROVER, ADMIN = "operator", "reviewer", "approver", "admin"
ROLES = (OPERATOR, REVIEWER, APPROVER, ADMIN)
# The admin role's own: managing people (feedback/admin.py keeps it off promoting accounts).
USER_MANAGEMENT = ("auth.view_user", "auth.add_user", "auth.change_user", "auth.view_group", "auth.change_group")


@dataclass(frozen=True)
class AppRoles:
    """An app's part of the roles: the permissions (`app_label.codename`, of its own models)
    each role holds in it, and those only a superuser hands out (a role or an account
    holding one is given or changed by a superuser alone). The admin role holds every
    permission of the app."""

    grants: Mapping[str, Sequence[str]] = field(default_factory=dict)
    superuser_only: Sequence[str] = ()


def apps_roles() -> dict[str, AppRoles]:
    """Each app's declared roles by app label, in INSTALLED_APPS order. An app that names a
    role that does not exist, or a permission of another app, is refused: each app answers
    for its own permissions."""
    found: dict[str, AppRoles] = {}
    for config in global_apps.get_app_configs():
        roles = getattr(config, "roles", None)
        if roles is None:
            continue
        if unknown := sorted(set(roles.grants) - set(ROLES)):
            raise ImproperlyConfigured(f"{config.name}: no role {unknown[0]!r} (the roles: {', '.join(ROLES)})")
        for name in [*(n for names in roles.grants.values() for n in names), *roles.superuser_only]:
            if name.split(".", 1)[0] != config.label:
                raise ImproperlyConfigured(f"{config.name} declares {name!r}: an app declares its own permissions only")
        found[config.label] = roles
    return found


def role_permissions() -> dict[str, list[str]]:
    """Each role's permissions as the apps declare them; the admin role's are user
    management (`roles_sync` also gives it every permission of the declaring apps)."""
    out: dict[str, list[str]] = {role: [] for role in ROLES}
    out[ADMIN] += USER_MANAGEMENT
    for roles in apps_roles().values():
        for role, names in roles.grants.items():
            out[role] += [n for n in names if n not in out[role]]
    return out


def superuser_only_permissions() -> frozenset[str]:
    """The permissions that only a superuser hands out, with the roles and accounts holding
    one (promotions' request and approval: four eyes)."""
    return frozenset(name for roles in apps_roles().values() for name in roles.superuser_only)


def roles_sync(*, apps=global_apps, during_migration: bool = False) -> None:
    """Create the role groups; add missing permissions. `apps` gives the models (the
    historical ones in a migration); the declarations are the installed apps'.

    In the data migration, permissions of models that later migrations create do not exist
    yet (the post_migrate run adds them), so their absence is only worth a debug line."""
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    by_name = {
        f"{app}.{codename}": pk
        for pk, app, codename in Permission.objects.values_list("pk", "content_type__app_label", "codename")
    }
    admin_apps = set(apps_roles())
    for role, names in role_permissions().items():
        group, _ = Group.objects.get_or_create(name=role)
        wanted = {by_name[n] for n in names if n in by_name}
        for missing in sorted(set(names) - set(by_name)):
            level = logging.DEBUG if during_migration else logging.WARNING
            logger.log(level, "role %s: permission %s does not exist (yet)", role, missing)
        if role == ADMIN:
            wanted |= {pk for name, pk in by_name.items() if name.split(".", 1)[0] in admin_apps}
        group.permissions.add(*wanted)


def user_roles(user) -> set[str]:
    """The role names a user holds (a superuser holds them all)."""
    if user.is_superuser:
        return set(ROLES)
    return set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
