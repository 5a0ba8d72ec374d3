from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from training.promotion.rollout_models import ReleasePlan
from training.promotion.services.live_set import live_set_by_command
from training.promotion.services.promotion_refused import PromotionRefused
from training.promotion.services.release_plans import release_plan_create, release_plan_revise
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
# The demo's candidate is a LoRA adapter over the bare base it replaces: on a CPU the adapter's
# own arithmetic made its answers 40-80 % slower than the base's (the fast demo, a 2-core
# machine), past the default threshold of 25 %, so the release waited at 50 % and would have
# been rolled back on latency. The demo tolerates twice the base's latency; every other signal
# keeps its default.
DEMO_PLAN_THRESHOLDS = {"latency": 1.0}
DEMO_PLAN_DESCRIPTION = (
    "the demo's short progressive release: 10 % then 50 % of conversations, then all; "
    "latency may double (an adapter against the bare base on a CPU)"
)


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
        plan = ReleasePlan.objects.filter(deployment=deployment, name=DEMO_PLAN).first()
        if plan is None:
            release_plan_create(
                name=DEMO_PLAN,
                deployment=deployment,
                steps=DEMO_PLAN_STEPS,
                thresholds=DEMO_PLAN_THRESHOLDS,
                description=DEMO_PLAN_DESCRIPTION,
            )
            return
        # A data folder from an earlier version of the demo gets the plan as it is now.
        release_plan_revise(
            plan=plan, steps=DEMO_PLAN_STEPS, thresholds=DEMO_PLAN_THRESHOLDS, description=DEMO_PLAN_DESCRIPTION
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
