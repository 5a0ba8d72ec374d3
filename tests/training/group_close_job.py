"""Run by `tests/training/test_fsdp.py` under torchrun: join the job's group, load the tiny
model (loading imports torch's FSDP modules), take a collective, leave the group, and print
the names of the threads this process still runs: `group_close_job.py MODEL OUT_DIR`
writes OUT_DIR/<rank>.json."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import torch

    from tests.fixtures.configs import small
    from training.trainer.config import GRPOConfig
    from training.trainer.parallel import process_group_close, process_group_init
    from training.trainer.policy import load_policy

    torch.set_num_threads(1)
    ranks = process_group_init(cuda=False, timeout_seconds=120)
    policy = load_policy(small(GRPOConfig, sys.argv[1]))
    ranks.parameters_broadcast(list(policy.model.parameters()))
    process_group_close(together=True)
    threads = []
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended since the listing
            threads.append(Path(f"/proc/self/task/{task}/comm").read_text().strip())
    (Path(sys.argv[2]) / f"{ranks.rank}.json").write_text(json.dumps({"rank": ranks.rank, "threads": threads}))


if __name__ == "__main__":
    main()
