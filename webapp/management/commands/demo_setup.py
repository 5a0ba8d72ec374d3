from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from feedback.services.deployments import deployment_get_or_create

DEMO_USERS = [
    # username, password, staff
    ("operator", "operator-demo", False),
    ("approver", "approver-demo", False),
    ("admin", "admin-demo", True),
]


class Command(BaseCommand):
    help = "Create the demo deployment and the demo logins (idempotent). For local demos only."

    def handle(self, *args, **opts) -> None:
        deployment_get_or_create(name="support-bot", description="Acme Store's customer-support agent")
        User = get_user_model()
        for username, password, staff in DEMO_USERS:
            user, created = User.objects.get_or_create(username=username)
            if created:
                user.set_password(password)
                user.is_staff = user.is_superuser = staff
                user.save()
        self.stdout.write("demo deployment 'support-bot' and logins operator, approver, admin are ready")
