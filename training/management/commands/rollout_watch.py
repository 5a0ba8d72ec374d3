from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from training.promotion.rollout_models import ACTIVE_STATES, Rollout, RolloutChange


def _share(share: float | None) -> str:
    return "—" if share is None else f"{100 * share:g} %"


def _at(moment) -> str:
    return timezone.localtime(moment).strftime("%H:%M:%S")


def change_line(change: RolloutChange) -> str:
    """`15:58:17 automatic  running 10 % -> running 50 %: every signal …`"""
    if not change.from_state:  # the approval that created it
        return f"{_at(change.at)} {change.actor_name:<10} {change.reason}"
    before = f"{change.from_state or 'approved'} {_share(change.from_share)}"
    after = f"{change.to_state} {_share(change.to_share)}"
    return f"{_at(change.at)} {change.actor_name:<10} {before} -> {after}: {change.reason}"


def check_line(rollout: Rollout) -> str:
    """The latest automatic check: what it decided at which share, and why."""
    last = rollout.last_check or {}
    return f"{_at(rollout.checked_at)} check      at {_share(last.get('share'))}: {last.get('action')} — {last.get('reason')}"


class Command(BaseCommand):
    help = (
        "Print a progressive release's plan and every change of step as it happens (who or the automatic "
        "check, from which share to which, and why), and with --checks each check's decision; ends when "
        "the release does. The release page (/rollouts/<id>/) shows the same, with the signals."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("rollout", nargs="?", type=int, help="the release's id (its page is /rollouts/<id>/)")
        parser.add_argument("--deployment", help="instead of an id: the deployment's latest progressive release")
        parser.add_argument("--checks", action="store_true", help="also each check's decision (wait, advance …)")
        parser.add_argument("--every", type=float, default=2.0, help="seconds between looks (default 2)")
        parser.add_argument("--once", action="store_true", help="print what has happened so far and exit")
        parser.add_argument("--timeout", type=float, default=0, help="give up after this many seconds (0: never)")

    def handle(self, *args, **opts) -> None:
        rollout = self._rollout(opts)
        plan = " -> ".join(_share(s["share"]) for s in rollout.steps)
        self.stdout.write(
            f"progressive release {rollout.pk}: {rollout.baseline.name} -> {rollout.candidate.name} "
            f"for {rollout.deployment.name}, plan {rollout.plan.get('name')} ({plan})"
        )
        shown, checked = 0, None
        deadline = time.monotonic() + opts["timeout"] if opts["timeout"] > 0 else None
        while True:
            rollout.refresh_from_db()
            for change in rollout.changes.filter(pk__gt=shown).order_by("pk"):
                self.stdout.write(change_line(change))
                shown = change.pk
            if opts["checks"] and rollout.checked_at and rollout.checked_at != checked:
                checked = rollout.checked_at
                self.stdout.write(check_line(rollout))
            if opts["once"] or rollout.state not in ACTIVE_STATES:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise CommandError(f"still {rollout.get_state_display().lower()} after {opts['timeout']:g} s")
            time.sleep(max(opts["every"], 0.2))
        self.stdout.write(f"{rollout.get_state_display()} at {_share(rollout.share)}: {rollout.reason}")

    def _rollout(self, opts) -> Rollout:
        rollouts = Rollout.objects.select_related("deployment", "candidate", "baseline")
        if opts["rollout"] is not None:
            rollout = rollouts.filter(pk=opts["rollout"]).first()
            if rollout is None:
                raise CommandError(f"no progressive release {opts['rollout']}")
            return rollout
        if not opts["deployment"]:
            raise CommandError("name the release (its id) or --deployment")
        rollout = rollouts.filter(deployment__name=opts["deployment"]).order_by("-started_at", "-id").first()
        if rollout is None:
            raise CommandError(f"no progressive release of {opts['deployment']} yet: approve a request with a plan")
        return rollout
