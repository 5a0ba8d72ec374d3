"""The Django admin for a staff user who holds the admin role but is not a superuser: what
answers customers (a base model's weights and server, a version's folder, kind and status)
is read-only there, and no one can grant themselves more than they hold."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission

from tests.factories import UserFactory, user_with_role
from training.serving.models import BaseModel, ModelVersion, ModelVersionKind, ModelVersionStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff(client):
    user = user_with_role("admin", "ada", is_staff=True)
    assert not user.is_superuser
    client.force_login(user)
    return user


@pytest.fixture
def live_base(tmp_path):
    base = BaseModel.objects.create(name="smol", path=str(tmp_path / "smol"), inference_url="http://127.0.0.1:8001")
    version = ModelVersion.objects.create(
        name="smol-v2",
        base_model=base,
        kind=ModelVersionKind.LORA,
        path=str(tmp_path / "v2"),
        status=ModelVersionStatus.LIVE,
    )
    return base, version


def test_the_serving_fields_cannot_be_changed_in_the_admin(client, staff, live_base):
    base, version = live_base
    response = client.post(
        f"/admin/serving/basemodel/{base.pk}/change/",
        {
            "name": "smol",
            "path": "/tmp/evil",
            "inference_url": "http://evil.example:80",
            "description": "",
            "metadata": "{}",
        },
    )
    assert response.status_code == 403
    response = client.post(
        f"/admin/serving/modelversion/{version.pk}/change/",
        {
            "name": "smol-v2",
            "base_model": base.pk,
            "kind": "full",
            "path": "/tmp/evil",
            "status": "live",
            "metadata": "{}",
        },
    )
    assert response.status_code == 403
    assert client.post("/admin/serving/basemodel/add/", {"name": "x", "path": "/tmp/x"}).status_code == 403
    assert client.post(f"/admin/serving/modelversion/{version.pk}/delete/", {"post": "yes"}).status_code == 403
    base.refresh_from_db()
    version.refresh_from_db()
    assert (base.path, base.inference_url) == (live_base[0].path, "http://127.0.0.1:8001")
    assert (version.path, version.kind) == (live_base[1].path, ModelVersionKind.LORA)
    # Still readable.
    assert client.get(f"/admin/serving/basemodel/{base.pk}/change/").status_code == 200


def _user_form(user, **changes) -> dict:
    data = {
        "username": user.username,
        "first_name": "",
        "last_name": "",
        "email": "",
        "is_active": "on",
        "is_staff": "on" if user.is_staff else "",
        "groups": [str(g.pk) for g in user.groups.all()],
        "last_login_0": "",
        "last_login_1": "",
        "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": user.date_joined.strftime("%H:%M:%S"),
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v != ""}


def test_a_staff_admin_cannot_make_itself_superuser_or_grant_itself_permissions(client, staff):
    everything = [str(p.pk) for p in Permission.objects.all()]
    response = client.post(
        f"/admin/auth/user/{staff.pk}/change/", _user_form(staff, is_superuser="on", user_permissions=everything)
    )
    # Its own account holds the admin role, which approves promotions: a superuser's to change.
    assert response.status_code == 403
    staff.refresh_from_db()
    assert not staff.is_superuser and not staff.user_permissions.exists()

    # A group that holds what the admin role does not is not theirs to hand out.
    powerful = Group.objects.create(name="powerful")
    powerful.permissions.set(Permission.objects.filter(content_type__app_label="sessions"))
    pat = UserFactory(username="pat")
    client.post(
        f"/admin/auth/user/{pat.pk}/change/",
        _user_form(pat, is_superuser="on", user_permissions=everything, groups=[str(powerful.pk)]),
    )
    pat.refresh_from_db()
    assert not pat.groups.filter(name="powerful").exists()
    assert not pat.is_superuser and not pat.user_permissions.exists()

    # Nor can a role's permissions be widened.
    admin_group = Group.objects.get(name="admin")
    before = set(admin_group.permissions.values_list("pk", flat=True))
    client.post(f"/admin/auth/group/{admin_group.pk}/change/", {"name": "admin", "permissions": everything})
    assert set(admin_group.permissions.values_list("pk", flat=True)) == before

    # Roles the admin holds every permission of can still be given (user management works),
    # except those that request or approve promotions (tests/promotion/test_account_four_eyes.py).
    operator = UserFactory(username="olga")
    client.post(
        f"/admin/auth/user/{operator.pk}/change/",
        _user_form(operator, groups=[str(Group.objects.get(name="reviewer").pk)]),
    )
    assert operator.groups.filter(name="reviewer").exists()


def test_a_staff_admin_cannot_take_over_a_superuser_account(client, staff):
    root = UserFactory(username="root", is_superuser=True, is_staff=True)
    response = client.post(
        f"/admin/auth/user/{root.pk}/password/", {"password1": "taken-over-1", "password2": "taken-over-1"}
    )
    assert response.status_code == 403
    root.refresh_from_db()
    assert not root.check_password("taken-over-1")
