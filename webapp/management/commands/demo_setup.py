from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from feedback.services.deployments import deployment_get_or_create

DEMO_USERS = [
    # username, password, staff, role group
    ("operator", "operator-demo", False, "operator"),
    ("approver", "approver-demo", False, "approver"),
    ("reviewer", "reviewer-demo", False, "reviewer"),
    ("admin", "admin-demo", True, "admin"),
]


class Command(BaseCommand):
    help = "Create the demo deployment and the demo logins (idempotent). For local demos only."

    def handle(self, *args, **opts) -> None:
        deployment_get_or_create(name="support-bot", description="Acme Store's customer-support agent")
        User = get_user_model()
        for username, password, staff, role in DEMO_USERS:
            user, created = User.objects.get_or_create(username=username)
            if created:
                user.set_password(password)
                user.is_staff = user.is_superuser = staff
                user.save()
            user.groups.add(Group.objects.get(name=role))
        self.stdout.write("demo deployment 'support-bot' and logins operator, approver, reviewer, admin are ready")
