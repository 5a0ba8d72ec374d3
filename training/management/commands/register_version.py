from __future__ import annotations

from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from training.serving.models import BaseModel, ModelVersion, ModelVersionKind
from training.serving.services import ModelRegistryError, model_version_create


class Command(BaseCommand):
    help = "Register a LoRA adapter folder (or a full checkpoint) as a candidate version of a base model."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--base", required=True, help="base model name")
        parser.add_argument("--path", required=True, type=Path)
        parser.add_argument("--kind", choices=[ModelVersionKind.LORA, ModelVersionKind.FULL], default="lora")
        parser.add_argument("--parent", help="the version it was derived from")

    def handle(self, *args, **opts) -> None:
        base = BaseModel.objects.filter(name=opts["base"]).first()
        if base is None:
            raise CommandError(f"no base model named {opts['base']!r} (prepare_model registers one)")
        parent = None
        if opts["parent"]:
            parent = ModelVersion.objects.filter(name=opts["parent"]).first()
            if parent is None:
                raise CommandError(f"no version named {opts['parent']!r}")
        try:
            version = model_version_create(
                name=opts["name"], base_model=base, kind=opts["kind"], path=opts["path"], parent=parent
            )
        except ModelRegistryError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"Registered {version.kind} version {version.name}"))
