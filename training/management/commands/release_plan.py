from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from training.promotion.services.release_plans import PlanInvalid, release_plan_create, release_plans_for
from training.serving.models import Deployment


def _steps(text: str) -> list[dict]:
    """`5:50:30,25:200:60,100` -> share % : least conversations : least minutes, per step."""
    steps = []
    for i, part in enumerate(p for p in text.split(",") if p.strip()):
        fields = [f.strip().rstrip("%") for f in part.split(":")]
        try:
            share, *rest = (float(f) for f in fields)
        except ValueError as exc:
            raise CommandError(f"--steps, step {i + 1} ({part!r}): numbers as share:conversations:minutes") from exc
        if len(rest) > 2:
            raise CommandError(f"--steps, step {i + 1} ({part!r}): at most share:conversations:minutes")
        # As read, not rounded: the plan's validation names a NaN, an infinity or a fraction by its field.
        step = {"share": share / 100, "min_minutes": rest[1] if len(rest) > 1 else 0}
        if rest:  # else the plan's default minimum
            step["min_conversations"] = rest[0]
        steps.append(step)
    return steps


class Command(BaseCommand):
    help = (
        "Create a release plan for progressive releases (offered on the approval form), or list a "
        "deployment's plans. Steps are share %:least conversations:least minutes, e.g. "
        "--steps 5:50:30,25:200:60,100; --threshold empty_rate=0.02 changes a signal's threshold."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", nargs="?", help="the new plan's name (omit with --list)")
        parser.add_argument("--deployment", help="the deployment it is for (omit: offered to every deployment)")
        parser.add_argument(
            "--steps",
            default="5:50:30,25:200:60,100",
            help="share %%:least conversations:least minutes, comma-separated",
        )
        parser.add_argument("--threshold", action="append", default=[], help="code=value, e.g. latency=0.5")
        parser.add_argument("--default", action="store_true", help="preselect it when approving")
        parser.add_argument("--description", default="", help="shown beside its name")
        parser.add_argument("--list", action="store_true", help="list the plans offered to --deployment")

    def handle(self, *args, **opts) -> None:
        deployment = None
        if opts["deployment"]:
            deployment = Deployment.objects.filter(name=opts["deployment"]).first()
            if deployment is None:
                raise CommandError(f"no deployment named {opts['deployment']!r}")
        if opts["list"]:
            if deployment is None:
                raise CommandError("--list needs --deployment")
            for plan in release_plans_for(deployment=deployment):
                shares = " -> ".join(f"{100 * s['share']:g} %" for s in plan.steps)
                self.stdout.write(f"{plan.pk}\t{plan.name}\t{shares}{'  (default)' if plan.is_default else ''}")
            return
        if not opts["name"]:
            raise CommandError("name the plan (or --list)")
        thresholds = {}
        for item in opts["threshold"]:
            code, _, value = item.partition("=")
            try:
                thresholds[code.strip()] = float(value)
            except ValueError as exc:
                raise CommandError(f"--threshold {item!r}: code=number") from exc
        try:
            plan = release_plan_create(
                name=opts["name"],
                deployment=deployment,
                steps=_steps(opts["steps"]),
                thresholds=thresholds,
                is_default=opts["default"],
                description=opts["description"],
            )
        except PlanInvalid as exc:
            raise CommandError(f"{exc.field}: {exc.reason}") from exc
        self.stdout.write(self.style.SUCCESS(f"release plan {plan.name} ({plan.pk}) created"))
