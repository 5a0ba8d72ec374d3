from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from training.services.job_processes import NodeError, training_job_node_run


class Command(BaseCommand):
    help = (
        "Join a training job over several nodes from this machine as node --node-rank (1 or more): waits "
        "until a worker runs the job, then starts the same torchrun (PRACTICUM_TRAINING_TORCHRUN_ARGS: "
        "--nnodes M --node-rank 0 --master-addr HEAD --master-port P) as that node, whose processes train "
        "their shares; the worker's node is node 0 and owns the job. Exits with torchrun's code."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--job", type=int, required=True, help="the training job's id")
        parser.add_argument("--node-rank", type=int, required=True, help="this node's rank, 1 to nnodes - 1")
        parser.add_argument("--wait", type=float, default=600.0, help="seconds to wait for a worker to start it")

    def handle(self, *args, **opts) -> None:
        try:
            code = training_job_node_run(job_id=opts["job"], node_rank=opts["node_rank"], wait_seconds=opts["wait"])
        except NodeError as exc:
            raise CommandError(str(exc)) from None
        if code:
            raise SystemExit(code)
