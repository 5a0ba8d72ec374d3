"""Measure a model version's student-teacher gap on the support desk and store it.

python manage.py probe_gap smollm2-135m-instruct --contexts 40
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from training.services.gap_probes import gap_probe_record
from training.services.jobs import model_paths
from training.serving.models import ModelVersion
from training.trainer.gap_probe import gap_probe_run


class Command(BaseCommand):
    help = (
        "Measure P(right action | comment in context) - P(right action | none) on the support desk's "
        "decision contexts for a model version, print it per kind of order, and store it: distillation and "
        "hinted GRPO are offered for the version only where it reaches PRACTICUM_TRAINING_MIN_HINT_GAP."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("version", help="the model version's name")
        parser.add_argument("--contexts", type=int, default=40, help="decision contexts to measure on")
        parser.add_argument("--split", default="train", choices=["train", "validation", "test"])
        parser.add_argument("--hint-at", default="system", choices=["system", "last"], help="where the comment goes")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--threads", type=int, default=1, help="torch threads")

    def handle(self, *args, **opts) -> None:
        import torch  # noqa: PLC0415 — when it runs: `help` and the docs reference load every command

        version = ModelVersion.objects.select_related("base_model").filter(name=opts["version"]).first()
        if version is None:
            raise CommandError(f"no model version named {opts['version']!r}")
        if opts["contexts"] < 1:
            raise CommandError("--contexts must be at least 1")
        torch.set_num_threads(opts["threads"])
        paths = model_paths(version)
        result = gap_probe_run(
            model_path=paths["model_path"],
            adapter=paths["init_adapter"],
            count=opts["contexts"],
            split=opts["split"],
            seed=opts["seed"],
            hint_at=opts["hint_at"],
        )
        probe = gap_probe_record(version=version, result=result.as_dict(), split=opts["split"], hint_at=opts["hint_at"])
        out = self.stdout.write
        out(
            f"{version.name} on {result.n} decision contexts of support-desk/{opts['split']} (comment at {opts['hint_at']}):"
        )
        for kind, row in result.per_kind.items():
            out(
                f"  {kind:22s} n={row['n']:3d}  P(right|comment) {row['p_with']:.3f}  "
                f"P(right|none) {row['p_without']:.3f}  gap {row['gap']:+.3f}"
            )
        minimum = settings.TRAINING_MIN_HINT_GAP
        verdict = "offered" if result.gap >= minimum else "not offered"
        out(
            f"gap {result.gap:+.3f} (P(right|comment) {result.p_with:.3f} - P(right|none) {result.p_without:.3f}); "
            f"distillation and hinted GRPO {verdict} (minimum {minimum:.2f}); stored as probe {probe.pk}"
        )
