from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.utils.dateparse import parse_datetime

from feedback.services.stitching_backfill import traces_stitch_apply, traces_stitch_plan
from training.serving.models import Deployment


class Command(BaseCommand):
    help = (
        "Join a deployment's stored gateway traces that named no trace into one trace per conversation "
        "(the history rule of conversation stitching). Prints the plan; changes nothing without --apply."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--deployment", required=True, help="deployment name")
        parser.add_argument("--since", help="only traces started at or after this ISO 8601 time")
        parser.add_argument("--apply", action="store_true", help="carry the plan out (default: a dry run)")
        parser.add_argument("--verbose-plan", action="store_true", help="list every merge and fork")

    def handle(self, *args, **opts) -> None:
        deployment = Deployment.objects.filter(name=opts["deployment"]).first()
        if deployment is None:
            raise CommandError(f"no deployment {opts['deployment']!r}")
        since = None
        if opts["since"]:
            since = parse_datetime(opts["since"])
            if since is None:
                raise CommandError(f"--since: not an ISO 8601 time: {opts['since']!r}")
        plan = traces_stitch_plan(deployment_id=deployment.id, since=since)
        if opts["verbose_plan"]:
            for m in plan.merges:
                self.stdout.write(
                    f"merge {m.source_key} into {m.target_key}: {len(m.same)} repeated, {len(m.moved)} new message(s)"
                )
            for f in plan.forks:
                self.stdout.write(f"fork  {f.trace_key} of {f.parent_key} after {f.at} message(s)")
        verb = "merged" if opts["apply"] else "would merge"
        self.stdout.write(
            f"{plan.traces} gateway trace(s) without a client-given id: {verb} {len(plan.merges)} into "
            f"{plan.conversations} conversation trace(s); {len(plan.forks)} fork(s) linked"
        )
        if opts["apply"]:
            traces_stitch_apply(plan=plan)
        else:
            self.stdout.write("dry run: nothing changed (run again with --apply)")
