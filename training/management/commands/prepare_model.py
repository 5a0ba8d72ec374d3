from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from training import modelprep
from training.promotion.services.live_set import live_set_by_command
from training.promotion.services.promotion_refused import PromotionRefused
from training.serving.services import (
    ModelRegistryError,
    base_model_register,
    deployment_get_or_create,
    registered_folder_owner,
)

DEFAULT_NAMES = {"smollm2": "smollm2-135m-instruct", "tiny": "tiny", "tiny-talking": "tiny-talking"}
PREPARE = {"smollm2": "smollm2_prepare", "tiny": "tiny_prepare", "tiny-talking": "tiny_talking_prepare"}


class Command(BaseCommand):
    help = (
        "Prepare a base model folder and register it: `smollm2` converts the packaged SmolLM2-135M-Instruct "
        "GGUF, `tiny` builds the tiny test model (random weights: it answers newlines), `tiny-talking` the same model "
        "fitted to answer every prompt with a short greeting (the FAST demo's), `local` registers any local Hugging Face folder (--path)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("kind", choices=["smollm2", "tiny", "tiny-talking", "local"])
        parser.add_argument("--path", type=Path, help="folder to write (smollm2/tiny) or to register (local)")
        parser.add_argument("--name", help="the base model's name, also the name the inference server serves")
        parser.add_argument("--live-for", metavar="DEPLOYMENT", help="make the base version live for this deployment")
        parser.add_argument("--force", action="store_true", help="rebuild the folder even if it exists")

    def handle(self, *args, **opts) -> None:
        kind = opts["kind"]
        name = opts["name"] or DEFAULT_NAMES.get(kind)
        if not name:
            raise CommandError("--name is required with `local`")
        path: Path | None = opts["path"]
        if kind == "local":
            if path is None:
                raise CommandError("--path is required with `local`")
        else:
            path = path or settings.MODELS_DIR / name
            owner = registered_folder_owner(path)
            complete = (path / "config.json").is_file() and (path / "model.safetensors").is_file()
            if owner is not None and (opts["force"] or not complete):
                # A registered folder's weights are what a deployment may be serving: never
                # rebuilt or written into, only read.
                raise CommandError(
                    f"{path} holds the weights of {owner}; nothing writes into a registered folder. "
                    "Prepare into another --path and register it under a new --name."
                )
            self.stdout.write(f"Preparing {kind} at {path} …")
            prepare = getattr(modelprep, PREPARE[kind])
            path = prepare(path, force=opts["force"])
        try:
            base, version = base_model_register(name=name, path=path, metadata={"prepared_as": kind})
        except ModelRegistryError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"Registered base model {base.name} ({base.path})"))
        if opts["live_for"]:
            deployment = deployment_get_or_create(name=opts["live_for"])
            try:
                live_set_by_command(deployment=deployment, version=version, reason="prepare_model --live-for")
            except PromotionRefused as exc:
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"{deployment.name} now serves {version.name}")
