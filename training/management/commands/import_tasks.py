"""Build a training set of replayable tasks from a JSONL file, one task a line:
{"prompt": "...", "reference": "...", "grader": "exact|contains|number|last_number|starts_with|json_valid",
 "system"?: "...", "feedback"?: "...", "target"?: "..."}."""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from training.services.training_sets import TrainingSetError, training_set_from_tasks


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser) -> None:
        parser.add_argument("path", type=Path)
        parser.add_argument("--name", required=True, help="the training set's name (a new version each import)")
        parser.add_argument("--heldout", type=float, default=0.2, help="held-out fraction (default 0.2)")

    def handle(self, *args, path: Path, name: str, heldout: float, **options) -> None:
        tasks = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                task = json.loads(line)
            except ValueError as exc:
                raise CommandError(f"line {number}: not JSON ({exc})") from None
            if not isinstance(task, dict):
                raise CommandError(f"line {number}: not an object")
            tasks.append(task)
        try:
            training_set = training_set_from_tasks(name=name, tasks=tasks, heldout_fraction=heldout)
        except TrainingSetError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"{training_set}: {training_set.train_count} train, {training_set.heldout_count} held out")
