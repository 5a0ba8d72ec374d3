from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from training.inference.client import InferenceError
from training.promotion.services.live_set import live_set_by_command
from training.promotion.services.promotion_checks import check_no_rollout_running
from training.promotion.services.promotion_refused import PromotionRefused
from training.services.inference import version_servers
from training.serving.models import ModelVersion, ModelVersionKind
from training.serving.services import ModelRegistryError, deployment_get_or_create


class Command(BaseCommand):
    help = (
        "Point a deployment at a model version. A LoRA version is loaded into every running inference "
        "server of its base model first (unless --no-load), so the gateway never routes to an adapter "
        "that is not there."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("deployment")
        parser.add_argument("version", help="model version name")
        parser.add_argument("--reason", default="")
        parser.add_argument("--no-load", action="store_true", help="do not load the adapter into the server")

    def handle(self, *args, **opts) -> None:
        version = ModelVersion.objects.select_related("base_model").filter(name=opts["version"]).first()
        if version is None:
            raise CommandError(f"no model version named {opts['version']!r}")
        deployment = deployment_get_or_create(name=opts["deployment"])
        running = check_no_rollout_running(deployment)  # before loading anything into the servers
        if not running.ok:
            raise CommandError(running.detail)
        if version.kind == ModelVersionKind.LORA and not opts["no_load"]:
            # Every replica first: the gateway may send the next request to any of them.
            for server in version_servers(version):
                try:
                    server.adapter_load(version.name, version.path)
                except InferenceError as exc:
                    raise CommandError(f"could not load {version.name} into {server.url}: {exc}") from exc
        try:
            live_set_by_command(deployment=deployment, version=version, reason=opts["reason"] or "set_live command")
        except (ModelRegistryError, PromotionRefused) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"{deployment.name} now serves {version.name}"))
