"""Four eyes against one person with two accounts: account and role changes are rows of the
append-only audit log, whoever created or changed the requester's account or roles cannot
approve its request (nor can the requester approve through an account it made), and only a
superuser hands out or manages the roles that request or approve promotions.

The issue's scenario end to end over HTTP: the Django admin creates the second account and
grants its role, the promotion API requests as it and approves as the admin."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from tests.factories import UserFactory, user_with_role
from tests.promotion.conftest import evaluation_row
from training.promotion.models import AuditAction, AuditEvent, PromotionRequest, Release

pytestmark = pytest.mark.django_db

PASSWORD = "a-long-enough-password-1"


def admin_creates_account(client, username: str) -> object:
    response = client.post(
        "/admin/auth/user/add/",
        {"username": username, "usable_password": "true", "password1": PASSWORD, "password2": PASSWORD},
    )
    assert response.status_code == 302, response.content[:2000]
    return get_user_model().objects.get(username=username)


def user_form(user, **changes) -> dict:
    data = {
        "username": user.username,
        "is_active": "on",
        "is_staff": "on" if user.is_staff else "",
        "groups": [str(g.pk) for g in user.groups.all()],
        "date_joined_0": user.date_joined.strftime("%Y-%m-%d"),
        "date_joined_1": user.date_joined.strftime("%H:%M:%S"),
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v != ""}


def request_promotion(client, user, registry) -> dict:
    client.force_login(user)
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    response = client.post(
        "/api/v1/promotions",
        {"candidate": registry.candidate.name, "deployment": registry.deployment.name, "evaluation": evaluation.pk},
        content_type="application/json",
    )
    return response


def account_events(client, viewer) -> list[tuple[str, str, str]]:
    client.force_login(viewer)
    events = client.get("/api/v1/audit").json()["events"]
    return [
        (e["action"], e["actor"], e["data"].get("username", e["data"].get("group", "")))
        for e in reversed(events)
        if e["deployment"] is None
    ]


@pytest.fixture
def root(db):
    return UserFactory(username="root", is_superuser=True, is_staff=True)


def test_an_admin_cannot_approve_a_request_of_an_account_it_created(client, registry, root, approver):
    client.force_login(root)
    puppet = admin_creates_account(client, "puppet")
    operator_group = Group.objects.get(name="operator")
    changed = client.post(f"/admin/auth/user/{puppet.pk}/change/", user_form(puppet, groups=[str(operator_group.pk)]))
    assert changed.status_code == 302
    assert puppet.groups.filter(name="operator").exists()

    asked = request_promotion(client, puppet, registry)
    assert asked.status_code == 201, asked.json()
    promotion = asked.json()["id"]

    client.force_login(root)
    refused = client.post(f"/api/v1/promotions/{promotion}/approve", {"comment": "ok"}, "application/json")
    assert refused.status_code == 409, refused.json()
    error = refused.json()["errors"][0]
    assert error["field"] == "requested_by"
    assert "you created or changed puppet's account or roles" in error["reason"]
    assert PromotionRequest.objects.get(pk=promotion).status == "pending"
    assert not Release.objects.exists()
    # The request page says why, beside the other preconditions.
    page = client.get(f"/promotions/{promotion}/").content.decode()
    assert 'data-code="independent"' in page and "you created or changed puppet&#x27;s account or roles" in page
    assert re.search(r'id="approve"[^>]* disabled', page)

    # Someone who had no hand in the account approves.
    client.force_login(approver)
    assert client.post(f"/api/v1/promotions/{promotion}/approve", {}, "application/json").status_code == 202

    assert account_events(client, approver) == [
        (AuditAction.ACCOUNT_CREATED, "root", "puppet"),
        (AuditAction.ROLES_CHANGED, "root", "puppet"),
    ]
    roles = AuditEvent.objects.get(action=AuditAction.ROLES_CHANGED)
    assert roles.data["added"] == ["operator"] and roles.data["removed"] == []


def test_nor_approve_through_an_account_it_created_or_whose_password_it_set(client, registry, root, operator):
    client.force_login(root)
    stamp = admin_creates_account(client, "rubber-stamp")
    approver_group = Group.objects.get(name="approver")
    client.post(f"/admin/auth/user/{stamp.pk}/change/", user_form(stamp, groups=[str(approver_group.pk)]))
    assert stamp.groups.filter(name="approver").exists()

    asked = request_promotion(client, root, registry)
    assert asked.status_code == 201, asked.json()
    client.force_login(stamp)
    refused = client.post(f"/api/v1/promotions/{asked.json()['id']}/approve", {}, "application/json")
    assert refused.status_code == 409
    assert "root created or changed your account or roles" in refused.json()["errors"][0]["reason"]

    # An existing approver whose password the requester set is the requester's too.
    other = user_with_role("approver", "vera")
    client.force_login(root)
    reset = client.post(f"/admin/auth/user/{other.pk}/password/", {"password1": PASSWORD, "password2": PASSWORD})
    assert reset.status_code == 302
    other.refresh_from_db()
    client.force_login(other)
    refused = client.post(f"/api/v1/promotions/{asked.json()['id']}/approve", {}, "application/json")
    assert refused.status_code == 409
    password = AuditEvent.objects.get(action=AuditAction.PASSWORD_SET)
    assert (password.actor_name, password.data["username"]) == ("root", "vera")


@pytest.fixture
def staff(db):
    user = user_with_role("admin", "ada", is_staff=True)
    assert not user.is_superuser
    return user


def test_a_staff_admin_cannot_hand_out_or_take_over_the_roles_that_promote(client, registry, staff, operator, approver):
    """The issue's path: the admin role (staff, not superuser) creates a second account and
    gives it the operator role. Creating the account is user management and is logged; the
    roles that request or approve promotions are a superuser's to grant."""
    client.force_login(staff)
    puppet = admin_creates_account(client, "puppet")
    for role in ("operator", "approver", "admin"):
        group = Group.objects.get(name=role)
        client.post(f"/admin/auth/user/{puppet.pk}/change/", user_form(puppet, groups=[str(group.pk)]))
        assert not puppet.groups.exists(), role
    # Reviewers can still be made: the admin role keeps managing the accounts that do not promote.
    reviewer = Group.objects.get(name="reviewer")
    assert (
        client.post(f"/admin/auth/user/{puppet.pk}/change/", user_form(puppet, groups=[str(reviewer.pk)])).status_code
        == 302
    )
    assert list(puppet.groups.values_list("name", flat=True)) == ["reviewer"]
    assert request_promotion(client, puppet, registry).status_code == 403

    # Nor can it take over an account that already holds such a role.
    client.force_login(staff)
    for holder in (operator, approver):
        reset = client.post(f"/admin/auth/user/{holder.pk}/password/", {"password1": PASSWORD, "password2": PASSWORD})
        assert reset.status_code == 403
        holder.refresh_from_db()
        assert not holder.check_password(PASSWORD)
        assert client.post(f"/admin/auth/user/{holder.pk}/change/", user_form(holder, is_active="")).status_code == 403
    # Nor rename a role group (the roles are found by name).
    approver_group = Group.objects.get(name="approver")
    client.post(f"/admin/auth/group/{approver_group.pk}/change/", {"name": "reviewer-2"})
    assert Group.objects.filter(name="approver").exists()

    assert account_events(client, approver) == [
        (AuditAction.ACCOUNT_CREATED, "ada", "puppet"),
        (AuditAction.ROLES_CHANGED, "ada", "puppet"),
    ]


def test_account_changes_are_logged_with_who_made_them(client, root):
    client.force_login(root)
    user = admin_creates_account(client, "nina")
    client.post(f"/admin/auth/user/{user.pk}/change/", user_form(user, is_staff="on"))
    client.post(f"/admin/auth/user/{user.pk}/password/", {"password1": PASSWORD + "x", "password2": PASSWORD + "x"})
    group = Group.objects.get(name="reviewer")
    client.post(f"/admin/auth/user/{user.pk}/change/", user_form(user, is_staff="on", groups=[str(group.pk)]))
    client.post(f"/admin/auth/user/{user.pk}/change/", user_form(user, is_staff="on", groups=[]))
    events = list(AuditEvent.objects.order_by("id").values_list("action", "actor_name", "data"))
    assert [(a, who) for a, who, _ in events] == [
        (AuditAction.ACCOUNT_CREATED, "root"),
        (AuditAction.ACCOUNT_CHANGED, "root"),
        (AuditAction.PASSWORD_SET, "root"),
        (AuditAction.ROLES_CHANGED, "root"),
        (AuditAction.ROLES_CHANGED, "root"),
    ]
    assert events[1][2]["changes"] == {"is_staff": [False, True]}
    assert (events[3][2]["added"], events[4][2]["removed"]) == (["reviewer"], ["reviewer"])
    assert all(data["user_id"] == user.pk and data["username"] == "nina" for _, _, data in events)
    # The audit log refuses to forget them.
    from webapp.kernel.append_only import AuditImmutable

    with pytest.raises(AuditImmutable):
        AuditEvent.objects.filter(action=AuditAction.ACCOUNT_CREATED).delete()
