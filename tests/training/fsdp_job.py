"""A GRPO job on the tiny model, run by `tests/training/test_fsdp.py` and
`test_vllm_data_parallel.py` under torchrun (or as one plain process):
`python fsdp_job.py MODEL RUN_DIR [--sharding fsdp] [--cancel-at N] [--vllm-url URL] [--canaries]`.

Only item 0 of four can be rewarded, so in most steps one process keeps no group and pads
its passes; β > 0 (reference passes), two updates a batch (old log-probs) and micro-batches
of 2 rows make every lockstep path run. `--cancel-at N`: rank 0's stop hook answers yes
before step N (the job checkpoints step N-1 and returns, as a cancel does). Rank 0 prints
its result as one JSON line. `--vllm-url`: the rollouts come from that server (its key in
PRACTICUM_INFERENCE_API_KEY); `--canaries`: two canaries are evaluated at steps 0, 2 and 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import torch

    from tests.fixtures.configs import small
    from training.trainer.common import Hooks
    from training.trainer.config import GRPOConfig
    from training.trainer.grpo import grpo_train
    from training.trainer.items import TurnItem
    from training.trainer.parallel import process_exit, process_group_close, process_group_init, ranks_current

    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("run_dir")
    parser.add_argument("--sharding", default="replicate")
    parser.add_argument("--cancel-at", type=int, default=0)
    parser.add_argument("--vllm-url", default="")
    parser.add_argument("--canaries", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    distributed = "RANK" in os.environ
    ranks = process_group_init(cuda=False, timeout_seconds=120) if distributed else ranks_current()
    config = small(
        GRPOConfig,
        args.model,
        prompts_per_step=4,
        group_size=4,
        beta=0.04,
        updates_per_batch=2,
        micro_batch=2,
        processes=ranks.size,
        sharding=args.sharding,
    )
    if args.vllm_url:
        config.rollout, config.vllm_url = "vllm", args.vllm_url
    if args.canaries:
        config.eval_every = 2
        config.canaries = [{"prompt": f"Say B{i}.", "reference": "e", "grader": "contains"} for i in range(2)]
    items = [
        TurnItem(id=f"q{i}", messages=[{"role": "user", "content": f"Say something about A{i}."}]) for i in range(4)
    ]
    polls = {"n": 0}
    logs: list[str] = []

    def stop() -> bool:
        polls["n"] += 1
        return bool(args.cancel_at) and polls["n"] >= args.cancel_at

    result = grpo_train(
        config=config,
        items=items,
        # Item 0's samples are rewarded by their length; the others' all alike (no signal).
        score=lambda item, texts: [float(len(t) % 3) if item.id == "q0" else 0.0 for t in texts],
        run_dir=Path(args.run_dir),
        hooks=Hooks(should_stop=stop, log=logs.append) if ranks.owner else Hooks(),
        vllm_api_key=os.environ.get("PRACTICUM_INFERENCE_API_KEY", ""),
    )
    if ranks.owner:
        trained = [m["trained_sequences"] for m in result.history]
        out = {"status": result.status, "step": result.step, "trained_sequences": trained, "logs": logs}
        out["history"] = [
            {k: m[k] for k in ("reward_mean", "generated_tokens", "loss", "kl", "response_length")}
            for m in result.history
        ]
        out["evals"] = result.evals
        print(json.dumps(out), flush=True)
    if distributed:
        process_group_close(together=True)
        process_exit(0)


if __name__ == "__main__":
    main()
