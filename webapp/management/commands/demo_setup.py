from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from training.promotion.rollout_models import ReleasePlan
from training.services.live_set import live_set_by_command
from training.services.promotion_refused import PromotionRefused
from training.services.release_plans import release_plan_create
from training.serving.models import LiveVersion, ModelVersion, ModelVersionKind
from training.serving.services import deployment_get_or_create

DEMO_USERS = [
    # username, password, staff, role group
    ("operator", "operator-demo", False, "operator"),
    ("approver", "approver-demo", False, "approver"),
    ("reviewer", "reviewer-demo", False, "reviewer"),
    ("admin", "admin-demo", True, "admin"),
]

# A plan short enough for the demo agent's few conversations a minute (share, least
# conversations, least minutes per step).
DEMO_PLAN = "demo-steps"
DEMO_PLAN_STEPS = [
    {"share": 0.1, "min_conversations": 3, "min_minutes": 1},
    {"share": 0.5, "min_conversations": 5, "min_minutes": 1},
    {"share": 1.0},
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
        self._plan(deployment)

    def _plan(self, deployment) -> None:
        """A short release plan the demo agent's traffic walks in minutes (chosen on approval;
        the default stays "all at once", as the tour expects)."""
        if not ReleasePlan.objects.filter(deployment=deployment, name=DEMO_PLAN).exists():
            release_plan_create(
                name=DEMO_PLAN,
                deployment=deployment,
                steps=DEMO_PLAN_STEPS,
                description="the demo's short progressive release: 10 % then 50 % of conversations, then all",
            )

    def _serve(self, deployment, base_name: str) -> None:
        version = ModelVersion.objects.filter(name=base_name, kind=ModelVersionKind.BASE).first()
        if version is None:
            raise CommandError(f"no base model named {base_name!r}: run `manage.py prepare_model` first")
        live = LiveVersion.objects.select_related("version").filter(deployment=deployment).first()
        if live is not None and live.version.base_model_id == version.base_model_id:
            self.stdout.write(f"support-bot serves {live.version.name}")
            return
        try:
            live_set_by_command(deployment=deployment, version=version, reason="make demo")
        except PromotionRefused as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"support-bot now serves {version.name}")
