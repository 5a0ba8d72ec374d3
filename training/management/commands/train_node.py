from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Join a training job over several nodes from this machine: waits until a worker runs the job, "
        "then starts the same torchrun (PRACTICUM_TRAINING_TORCHRUN_ARGS, with its --nnodes and rendezvous), "
        "whose processes train their shares; the worker's node owns the job. Exits with torchrun's code."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--job", type=int, required=True, help="the training job's id")
        parser.add_argument("--wait", type=float, default=600.0, help="seconds to wait for a worker to start it")

    def handle(self, *args, **opts) -> None:
        from training.services.job_processes import NodeError, training_job_node_run

        try:
            code = training_job_node_run(job_id=opts["job"], wait_seconds=opts["wait"])
        except NodeError as exc:
            raise CommandError(str(exc)) from None
        if code:
            raise SystemExit(code)
