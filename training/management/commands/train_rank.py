from __future__ import annotations

import signal
import traceback

from django.core.management.base import BaseCommand
from django.db import connections

from training.services.job_processes import training_job_rank_run
from training.trainer.launch import parent_death_signal


class Command(BaseCommand):
    help = (
        "One process of a data-parallel training job, started by torchrun (RANK, WORLD_SIZE and the "
        "rendezvous come from its environment). The worker that holds the job launches it; see "
        "docs/decisions/0026-data-parallel-jobs.md."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--job", type=int, required=True, help="the training job's id")
        parser.add_argument("--worker", required=True, help="the name of the worker that holds the job")

    def handle(self, *args, **opts) -> None:
        # torchrun starts this process in a session of its own: should torchrun die (killed
        # with the worker that supervises it), this process must not train on, orphaned.
        parent_death_signal(signal.SIGKILL)

        from torch.distributed.elastic.multiprocessing.errors import record  # noqa: PLC0415 — torch (seconds) loads once the signal is set

        from training.trainer.parallel import process_exit  # noqa: PLC0415

        # `record` writes an exception to the file torchrun names, so its summary (and the
        # job's error) says what this process raised.
        try:
            status = record(training_job_rank_run)(job_id=opts["job"], worker=opts["worker"])
        except BaseException:
            # Printed here, as the interpreter would have; `record` has written it for torchrun.
            traceback.print_exc()
            status = "failed"
        connections.close_all()
        # Exit 1 makes torchrun stop the other processes. A raise ends here too: the group's
        # threads may outlive it as on a success (process_exit says why).
        process_exit(1 if status == "failed" else 0)
