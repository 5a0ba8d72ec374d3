"""Guessing passwords stops working: after the failure limit a username is locked, on the
login form and on HTTP Basic alike, the right password included, until the cool-off ends
or an administrator runs `manage.py axes_reset`."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from tests.factories import user_with_role

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"


@pytest.fixture
def olga():
    user = user_with_role("operator", "olga")
    user.set_password(PASSWORD)
    user.save()
    return user


def login(client: Client, password: str, *, address: str = "203.0.113.7"):
    return client.post("/login/", {"username": "olga", "password": password}, REMOTE_ADDR=address)


def basic(client: Client, password: str, *, address: str = "203.0.113.7"):
    token = base64.b64encode(f"olga:{password}".encode()).decode()
    return client.get("/api/v1/audit", HTTP_AUTHORIZATION=f"Basic {token}", REMOTE_ADDR=address)


def test_25_wrong_passwords_then_the_right_one_is_refused_on_the_login_form(olga):
    client = Client()
    assert login(client, PASSWORD).status_code == 302  # works before any guessing
    client.post("/logout/")
    for i in range(25):
        login(client, f"guess-{i}")
    response = login(client, PASSWORD)
    assert response.status_code == 429
    assert "Too many failed logins" in response.content.decode()
    assert "_auth_user_id" not in client.session
    # The lock is on the username: another address does not get around it.
    assert login(Client(), PASSWORD, address="198.51.100.9").status_code == 429


def test_the_lock_covers_http_basic_and_is_shared_with_the_form(olga, settings):
    client = Client()
    assert basic(client, PASSWORD).status_code == 200
    statuses = [basic(client, f"guess-{i}").status_code for i in range(25)]
    limit = settings.AXES_FAILURE_LIMIT
    assert set(statuses[: limit - 1]) == {403} and set(statuses[limit:]) == {429}
    locked = basic(client, PASSWORD)
    assert locked.status_code == 429 and "too many failed logins" in locked.json()["detail"]
    assert login(Client(), PASSWORD).status_code == 429


def test_axes_reset_lifts_the_lock(olga):
    client = Client()
    for i in range(25):
        login(client, f"guess-{i}")
    assert login(client, PASSWORD).status_code == 429
    call_command("axes_reset")
    assert login(client, PASSWORD).status_code == 302


def test_the_lock_ends_after_the_cool_off(olga, settings):
    from axes.models import AccessAttempt

    client = Client()
    for i in range(settings.AXES_FAILURE_LIMIT):
        login(client, f"guess-{i}")
    assert login(client, PASSWORD).status_code == 429
    AccessAttempt.objects.update(attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    assert login(client, PASSWORD).status_code == 302


def test_a_few_typos_do_not_lock_anyone_out(olga, settings):
    client = Client()
    for i in range(settings.AXES_FAILURE_LIMIT - 1):
        login(client, f"typo-{i}")
    assert login(client, PASSWORD).status_code == 302
    client.post("/logout/")
    # A success resets the count.
    for i in range(settings.AXES_FAILURE_LIMIT - 1):
        login(client, f"typo-{i}")
    assert login(client, PASSWORD).status_code == 302
