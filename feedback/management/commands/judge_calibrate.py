from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from feedback.judge.client import JudgeNotConfigured
from feedback.selectors.judge_gate import judge_training_gate
from feedback.services.judge_gate import judge_calibration_run
from training.serving.models import Deployment


class Command(BaseCommand):
    help = (
        "Score a deployment's rated turns with the prompt training uses (score-candidates, feedback "
        "left out), with order-swap checks, and print the judge's training gate."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--deployment", required=True)
        parser.add_argument("--limit", type=int, default=500, help="rated turns to score at most (default 500)")
        parser.add_argument("--no-swap-checks", action="store_true")

    def handle(self, *args, **opts) -> None:
        deployment = Deployment.objects.filter(name=opts["deployment"]).first()
        if deployment is None:
            raise CommandError(f"no deployment named {opts['deployment']!r}")
        try:
            counts = judge_calibration_run(
                deployment=deployment, limit=opts["limit"], swap_checks=not opts["no_swap_checks"]
            )
        except JudgeNotConfigured as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"Scored {counts['scored']} rated turns ({counts['failed']} failed), {counts['swap_checks']} order-swap checks."
        )
        gate = judge_training_gate(deployment=deployment)
        self.stdout.write(f"Training gate: {'open' if gate.allowed else 'closed'} — {gate.reason}")
