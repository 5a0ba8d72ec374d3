"""Let the simulated support lead review a deployment's support-desk traces."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from feedback.demo.operator import SIMULATED_OPERATOR, simulated_operator_review
from feedback.models import Trace
from training.serving.models import Deployment


class Command(BaseCommand):
    help = (
        "Comment, as the simulated support lead (a script that knows the refund policy; its account "
        f"is '{SIMULATED_OPERATOR}'), on every training-split support-desk trace of a deployment where a "
        "turn went against the policy: words only, sometimes vague, now and then wrong. Held-out traces "
        "are never commented."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--deployment", default="support-bot")
        parser.add_argument("--seed", type=int, default=0, help="picks the phrasings and which comments go wrong")
        parser.add_argument("--vague-rate", type=float, default=None, help="share of vague comments (default 0.2)")
        parser.add_argument("--wrong-rate", type=float, default=None, help="share of wrong comments (default 0.1)")

    def handle(self, *args, **opts) -> None:
        for name in ("vague_rate", "wrong_rate"):
            value = opts[name]
            if value is not None and not 0 <= value <= 1:
                raise CommandError(f"--{name.replace('_', '-')} must be between 0 and 1")
        deployment = Deployment.objects.filter(name=opts["deployment"]).first()
        if deployment is None:
            raise CommandError(f"no deployment named {opts['deployment']!r}")
        traces = Trace.objects.filter(deployment=deployment)
        counts = simulated_operator_review(
            traces=traces, seed=opts["seed"], vague_rate=opts["vague_rate"], wrong_rate=opts["wrong_rate"]
        )
        added = counts["specific"] + counts["vague"] + counts["wrong"]
        self.stdout.write(
            f"{added} comments as {SIMULATED_OPERATOR} "
            f"({counts['specific']} specific, {counts['vague']} vague, {counts['wrong']} wrong); "
            f"{counts['held_out']} held-out traces left alone; {counts['skipped']} traces of no known task"
        )
