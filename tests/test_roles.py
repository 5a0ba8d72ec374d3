"""The roles are the kernel's; what each may do in an app, the app declares on its
`AppConfig` (`roles`), and `roles_sync` gives the groups what the apps declare."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib.auth.models import Group, Permission
from django.core.exceptions import ImproperlyConfigured

from webapp.kernel.roles import (
    ADMIN,
    APPROVER,
    OPERATOR,
    AppRoles,
    apps_roles,
    role_permissions,
    superuser_only_permissions,
)

pytestmark = pytest.mark.django_db


def _names(permissions) -> set[str]:
    return {f"{p.content_type.app_label}.{p.codename}" for p in permissions.select_related("content_type")}


def test_each_role_group_holds_every_permission_the_apps_declare_and_each_exists():
    existing = _names(Permission.objects.all())
    for role, names in role_permissions().items():
        assert set(names) <= existing, f"{role}: no such permission {sorted(set(names) - existing)}"
        assert set(names) <= _names(Group.objects.get(name=role).permissions.all())


def test_the_apps_that_declare_roles_declare_them_and_the_admin_holds_all_their_permissions():
    assert set(apps_roles()) == {"serving", "feedback", "training"}
    assert "training.approve_promotion" in role_permissions()[APPROVER]
    assert superuser_only_permissions() == {"training.add_promotionrequest", "training.approve_promotion"}
    admin = _names(Group.objects.get(name=ADMIN).permissions.all())
    for label in apps_roles():
        assert _names(Permission.objects.filter(content_type__app_label=label)) <= admin


def test_an_app_declares_its_own_permissions_and_the_kernels_roles_only(monkeypatch):
    feedback = apps.get_app_config("feedback")
    monkeypatch.setattr(feedback, "roles", AppRoles(grants={OPERATOR: ["training.add_trainingjob"]}))
    with pytest.raises(ImproperlyConfigured, match=r"'training\.add_trainingjob': an app declares its own"):
        role_permissions()
    monkeypatch.setattr(feedback, "roles", AppRoles(superuser_only=["serving.change_liveversion"]))
    with pytest.raises(ImproperlyConfigured, match="its own permissions only"):
        superuser_only_permissions()
    monkeypatch.setattr(feedback, "roles", AppRoles(grants={"auditor": ["feedback.view_trace"]}))
    with pytest.raises(ImproperlyConfigured, match="no role 'auditor'"):
        role_permissions()
