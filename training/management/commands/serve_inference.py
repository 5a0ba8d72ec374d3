from __future__ import annotations

import logging
import os

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from training.inference.client import server_root
from training.inference.server import InferenceServer, cpu_shares, supervise_all, vllm_missing_reason
from training.services.inference import live_adapters_load, server_spec_for_base
from training.serving.models import BaseModel
from training.serving.selectors import base_model_replica_urls
from training.serving.services import ModelRegistryError, base_model_replicas_drop, base_model_replicas_set


class Command(BaseCommand):
    help = (
        "Start and supervise the vLLM inference server(s) for a base model on 127.0.0.1, load the live "
        "versions' adapters by name into each before it is ready, and restart any that dies. "
        "--replicas N starts N servers on consecutive ports from --port and records them on the base "
        "model, so the gateway spreads requests over them and releases load into each. Ctrl-C stops them."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--base", help="base model name (default: the only one, or the one live versions use)")
        parser.add_argument("--port", type=int, default=None, help=f"default {settings.INFERENCE_PORT}")
        parser.add_argument(
            "--replicas",
            type=int,
            default=None,
            help="start this many servers on consecutive ports and record them as the base model's replicas "
            "(on a CPU machine each binds to its share of the CPUs)",
        )
        parser.add_argument("--max-model-len", type=int, default=None)
        parser.add_argument(
            "--tensor-parallel-size",
            type=int,
            default=None,
            help="GPUs per server (vLLM's --tensor-parallel-size), from those CUDA_VISIBLE_DEVICES shows it",
        )
        parser.add_argument("--max-restarts", type=int, default=5)
        parser.add_argument(
            "--ready-timeout",
            type=float,
            default=600,
            help="seconds a (re)started server may take to answer before it counts as failed: its stacks go "
            "to its log and it is restarted",
        )
        parser.add_argument("--print-command", action="store_true", help="print the server command(s) and exit")

    def handle(self, *args, **opts) -> None:
        base = self._base(opts["base"])
        replicas = opts["replicas"]
        if replicas is not None and not 1 <= replicas <= 64:
            raise CommandError("--replicas: from 1 to 64")
        port = opts["port"] or settings.INFERENCE_PORT
        specs = [
            server_spec_for_base(base, port=port + i, max_model_len=opts["max_model_len"]) for i in range(replicas or 1)
        ]
        if opts["tensor_parallel_size"]:
            for spec in specs:
                spec.extra_args += ["--tensor-parallel-size", str(opts["tensor_parallel_size"])]
        if replicas and specs[0].device == "cpu" and not os.environ.get("VLLM_CPU_OMP_THREADS_BIND"):
            for spec, cpus in zip(specs, cpu_shares(replicas), strict=False):
                spec.extra_env["VLLM_CPU_OMP_THREADS_BIND"] = cpus
        if opts["print_command"]:
            for spec in specs:
                argv, _ = spec.command()
                bind = spec.extra_env.get("VLLM_CPU_OMP_THREADS_BIND")
                self.stdout.write((f"VLLM_CPU_OMP_THREADS_BIND={bind} " if bind else "") + " ".join(argv))
            return
        reason = vllm_missing_reason()
        if reason:
            raise CommandError(reason)
        primary = base_model_replica_urls(base=base)[0]
        if replicas is not None:
            if server_root(specs[0].url) != primary:
                raise CommandError(
                    f"{base.name} is served first by {primary} (its inference_url, else PRACTICUM_INFERENCE_URL); "
                    f"start the replicas from its port, not {specs[0].port}"
                )
            try:
                base_model_replicas_set(base=base, urls=[spec.url for spec in specs[1:]])
            except ModelRegistryError as exc:
                raise CommandError(exc.detail) from exc
            self.stdout.write(
                f"Recorded {base.name}'s replicas: {', '.join(base_model_replica_urls(base=base))} "
                "(the gateway spreads requests over them; releases load into each)"
            )
        elif server_root(specs[0].url) != primary:
            self.stderr.write(f"note: {base.name} is served from {primary}; serving on {specs[0].url}")
        if replicas is None and base.inference_replicas:
            self.stderr.write(
                f"note: {base.name} also lists the replicas {', '.join(base.inference_replicas)}, which this "
                "command does not start; releases fail while one is down (manage.py inference_replicas "
                f"{base.name} --clear if they are gone)"
            )
        recorded = [spec.url for spec in specs[1:]] if replicas is not None else []
        for name in ("training.inference", "training.services.inference"):
            logging.getLogger(name).setLevel(logging.INFO)
        servers = []
        for spec in specs:
            log_path = settings.DATA_DIR / "logs" / f"inference-{base.name}-{spec.port}.log"
            self.stdout.write(f"Serving {base.name} on {spec.url} ({spec.device}); server log: {log_path}")
            servers.append(InferenceServer(spec, log_path=log_path))

        def gave_up(server) -> None:
            # A replica this command recorded and no longer runs: left listed, the gateway
            # would keep probing it and every release of the base model would fail on it.
            if server.url in recorded:
                base_model_replicas_drop(base=base, urls=[server.url])
                self.stderr.write(f"{server.url} kept failing: taken off {base.name}'s replicas")

        try:
            code = supervise_all(
                servers,
                # Before the server counts as ready, and each time it restarts: a replica serves
                # the live adapters before the gateway's probe lets it take traffic again.
                on_ready=lambda server: live_adapters_load(base=base, server=server.client()),
                on_gave_up=gave_up,
                max_restarts=opts["max_restarts"],
                ready_timeout=opts["ready_timeout"],
            )
        finally:
            # The servers are stopped: the replicas this command recorded go with them.
            if recorded:
                base_model_replicas_drop(base=base, urls=recorded)
        if code:
            raise CommandError(f"the inference servers kept failing; see {settings.DATA_DIR / 'logs'}")

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
