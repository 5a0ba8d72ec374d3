from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from training.serving.models import BaseModel
from training.serving.selectors import base_model_replica_urls
from training.serving.services import ModelRegistryError, base_model_replicas_set


class Command(BaseCommand):
    help = (
        "Show or set the inference servers that serve a base model beside its inference_url (replicas, "
        "e.g. one per GPU node). Each must already serve the base model and load its live adapters on "
        "start (serve_inference does); releases load into every one. With no URLs it lists them."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("base", help="base model name")
        parser.add_argument("urls", nargs="*", help="http://host:port of each replica (not the inference_url)")
        parser.add_argument("--clear", action="store_true", help="serve the base model from its inference_url alone")

    def handle(self, *args, **opts) -> None:
        base = BaseModel.objects.filter(name=opts["base"]).first()
        if base is None:
            raise CommandError(f"no base model named {opts['base']!r}")
        if opts["urls"] or opts["clear"]:
            if opts["urls"] and opts["clear"]:
                raise CommandError("give URLs or --clear, not both")
            try:
                base = base_model_replicas_set(base=base, urls=opts["urls"])
            except ModelRegistryError as exc:
                raise CommandError(exc.detail) from exc
        for url in base_model_replica_urls(base=base):
            self.stdout.write(url)
