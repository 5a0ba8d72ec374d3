from __future__ import annotations

import logging

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from training.serving.models import BaseModel


class Command(BaseCommand):
    help = (
        "Start and supervise the vLLM inference server for a base model on 127.0.0.1, load the live "
        "versions' adapters by name, and restart it if it dies. Ctrl-C stops it."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--base", help="base model name (default: the only one, or the one live versions use)")
        parser.add_argument("--port", type=int, default=None, help=f"default {settings.INFERENCE_PORT}")
        parser.add_argument("--max-model-len", type=int, default=None)
        parser.add_argument("--max-restarts", type=int, default=5)
        parser.add_argument("--print-command", action="store_true", help="print the server command and exit")

    def handle(self, *args, **opts) -> None:
        from training.inference.server import InferenceServer, supervise, vllm_missing_reason
        from training.services.inference import live_adapters_load, server_spec_for_base

        base = self._base(opts["base"])
        spec = server_spec_for_base(base, port=opts["port"], max_model_len=opts["max_model_len"])
        argv, _ = spec.command()
        if opts["print_command"]:
            self.stdout.write(" ".join(argv))
            return
        reason = vllm_missing_reason()
        if reason:
            raise CommandError(reason)
        if base.inference_url and base.inference_url.rstrip("/") != spec.url:
            self.stderr.write(f"note: {base.name}'s inference_url is {base.inference_url}; serving on {spec.url}")
        for name in ("training.inference", "training.services.inference"):
            logging.getLogger(name).setLevel(logging.INFO)
        log_path = settings.DATA_DIR / "logs" / f"inference-{base.name}-{spec.port}.log"
        self.stdout.write(f"Serving {base.name} on {spec.url} ({spec.device}); server log: {log_path}")
        server = InferenceServer(spec, log_path=log_path)
        code = supervise(
            server,
            on_ready=lambda: live_adapters_load(base=base, server=server.client()),
            max_restarts=opts["max_restarts"],
        )
        if code:
            raise CommandError(f"inference server kept failing; see {log_path}")

    def _base(self, name: str | None) -> BaseModel:
        if name:
            base = BaseModel.objects.filter(name=name).first()
            if base is None:
                raise CommandError(f"no base model named {name!r}; run `manage.py prepare_model` first")
            return base
        candidates = list(BaseModel.objects.filter(versions__live_for__isnull=False).distinct()) or list(
            BaseModel.objects.all()
        )
        if len(candidates) != 1:
            names = ", ".join(b.name for b in candidates) or "none"
            raise CommandError(f"name the base model with --base (registered: {names})")
        return candidates[0]
