from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from training.inference.client import InferenceError, server_root
from training.services.inference import inference_client, live_adapters_load
from training.serving.models import BaseModel
from training.serving.selectors import base_model_replica_urls
from training.serving.services import ModelRegistryError, base_model_replicas_set


class Command(BaseCommand):
    help = (
        "Show or set the inference servers that serve a base model beside its inference_url (replicas, "
        "e.g. one per GPU node). Each must already serve the base model and load its live adapters on "
        "start (serve_inference does); releases load into every one. A server newly listed is given the "
        "live versions' adapters first, so the gateway never sends it a request for one it lacks. With no "
        "URLs it lists them."
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

            # Before it is listed: the gateway sends it traffic within its route cache's TTL,
            # and a replica lacking the live adapters answers each request with a 404.
            known = set(base_model_replica_urls(base=base))
            for url in opts["urls"]:
                if server_root(url) in known or not url.strip().lower().startswith("http://"):
                    continue  # already serving, or refused below naming the entry
                try:
                    live_adapters_load(base=base, server=inference_client(url))
                except InferenceError as exc:
                    raise CommandError(f"{url}: could not load the live adapters, nothing recorded: {exc}") from exc
            try:
                base = base_model_replicas_set(base=base, urls=opts["urls"])
            except ModelRegistryError as exc:
                raise CommandError(exc.detail) from exc
        for url in base_model_replica_urls(base=base):
            self.stdout.write(url)
