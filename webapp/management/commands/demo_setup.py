from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from training.serving.services import deployment_get_or_create

DEMO_USERS = [
    # username, password, staff, role group
    ("operator", "operator-demo", False, "operator"),
    ("approver", "approver-demo", False, "approver"),
    ("reviewer", "reviewer-demo", False, "reviewer"),
    ("admin", "admin-demo", True, "admin"),
]


class Command(BaseCommand):
    help = "Create the demo deployment and the demo logins (idempotent). For local demos only."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--serve-base",
            metavar="BASE",
            help="make this base model's own version live for support-bot, unless a version over it already is "
            "(a restart keeps a promoted version live)",
        )

    def handle(self, *args, **opts) -> None:
        deployment = deployment_get_or_create(name="support-bot", description="Acme Store's customer-support agent")
        if opts["serve_base"]:
            self._serve(deployment, opts["serve_base"])
        User = get_user_model()
        for username, password, staff, role in DEMO_USERS:
            user, created = User.objects.get_or_create(username=username)
            if created:
                user.set_password(password)
                user.is_staff = user.is_superuser = staff
                user.save()
            user.groups.add(Group.objects.get(name=role))
        self.stdout.write("demo deployment 'support-bot' and logins operator, approver, reviewer, admin are ready")

    def _serve(self, deployment, base_name: str) -> None:
        from training.services.live_set import live_set_by_command
        from training.serving.models import LiveVersion, ModelVersion, ModelVersionKind

        version = ModelVersion.objects.filter(name=base_name, kind=ModelVersionKind.BASE).first()
        if version is None:
            raise CommandError(f"no base model named {base_name!r}: run `manage.py prepare_model` first")
        live = LiveVersion.objects.select_related("version").filter(deployment=deployment).first()
        if live is not None and live.version.base_model_id == version.base_model_id:
            self.stdout.write(f"support-bot serves {live.version.name}")
            return
        live_set_by_command(deployment=deployment, version=version, reason="make demo")
        self.stdout.write(f"support-bot now serves {version.name}")
