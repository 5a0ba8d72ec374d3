"""Memory of setting up a sharded job (`"sharding": "fsdp"`): every process loading the
whole model and then sharding it, against rank 0 alone reading the weights (on the CPU)
while the other processes build an empty skeleton and receive their shards
(`trainer_setup`, `policy.model_skeleton`, `sharding.shard_model`). Measured side by
side in one run.

Each setting runs `trainer_setup` under `torchrun --standalone --nproc-per-node 2` (gloo,
one torch thread) on a random Qwen2-shaped model of ~270M parameters (1.1 GB in float32;
bench/ddp_step.py's "load" shape) with LoRA, and every process reports:
- its resident memory after the imports (transformers' model classes and peft included)
  and the process group, before the model;
- its peak resident memory during the setup, above that baseline (the page-cache
  mapping of the safetensors file counts while it is mapped);
- its resident memory once set up, above the baseline, and again after `malloc_trim(0)`
  (glibc keeps freed blocks below its mmap threshold in the heap, so the first figure
  includes the load's freed buffers);
- a checksum of the shard it holds, so that both settings are seen to hold the same values.

    .venv/bin/python bench/sharded_load.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.ddp_step import model_dir  # noqa: E402


def _rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(args) -> None:
    """One process of one setting (under torchrun): set the job up, write its figures."""
    import torch

    from training.trainer.config import SFTConfig
    from training.trainer.parallel import process_exit, process_group_close, process_group_init
    from training.trainer.policy import load_policy
    from training.trainer.run import setup_torch, trainer_setup
    from training.trainer.sharding import held

    torch.set_num_threads(1)
    ranks = process_group_init(cuda=False, timeout_seconds=600)
    # The libraries the load imports count in the baseline, not in the load.
    import accelerate  # noqa: F401
    import peft  # noqa: F401
    from transformers import Qwen2ForCausalLM  # noqa: F401

    Path("/proc/self/clear_refs").write_text("5")  # resets the peak (VmHWM) to the current RSS
    baseline = _rss_mib()
    config = SFTConfig(model_path=args.model, processes=ranks.size, sharding="fsdp", steps=1)
    policy = None
    if args.mode == "every-process-loads":
        setup_torch(config)  # seeded before the adapter is drawn, as trainer_setup does
        policy = load_policy(config)
    trainer = trainer_setup(config, policy=policy, reference=False)
    status = Path("/proc/self/status").read_text()
    peak = int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1]) / 1024
    after = _rss_mib()
    # glibc keeps freed blocks under its mmap threshold in the heap: what the process would
    # hold once they are handed back.
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    trimmed = _rss_mib()
    local, whole = held(trainer.policy.model)
    checksum = sum(float(p.to_local().double().sum()) for p in trainer.policy.model.parameters())
    figures = {
        "rank": ranks.rank,
        "baseline_mib": round(baseline),
        "peak_above_mib": round(peak - baseline),
        "after_above_mib": round(after - baseline),
        "trimmed_above_mib": round(trimmed - baseline),
        "weights_held": local,
        "weights": whole,
        "checksum": checksum,
        "ru_maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    Path(f"{args.out}.{ranks.rank}").write_text(json.dumps(figures))
    process_group_close()
    process_exit(0)


def run_setting(model: Path, mode: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "figures"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        command += [__file__, "--worker", "--mode", mode, "--model", str(model), "--out", str(out)]
        env = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
        return [json.loads(Path(f"{out}.{rank}").read_text()) for rank in (0, 1)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--mode", default="rank-0-loads", choices=["rank-0-loads", "every-process-loads"])
    parser.add_argument("--model")
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cache", default=str(ROOT / "var" / "bench-models"))
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    model = model_dir("load", Path(args.cache))
    size = sum(f.stat().st_size for f in model.glob("*.safetensors")) / 2**20
    print(f"model: {model} ({size:.0f} MiB of safetensors)")
    results: dict[str, list[list[dict]]] = {"every-process-loads": [], "rank-0-loads": []}
    for _ in range(args.rounds):  # alternating, so a change in the machine's load hits both
        for mode in results:
            results[mode].append(run_setting(model, mode))
    print(
        "| setting | rank | peak above baseline (MiB) | held after setup (MiB) | after malloc_trim (MiB) | weights held |"
    )
    print("|---|---|---|---|---|---|")
    for mode, rounds in results.items():
        for rank in (0, 1):
            peaks = sorted(r[rank]["peak_above_mib"] for r in rounds)
            afters = sorted(r[rank]["after_above_mib"] for r in rounds)
            trims = sorted(r[rank]["trimmed_above_mib"] for r in rounds)
            held = rounds[0][rank]["weights_held"]
            middle = len(rounds) // 2
            print(f"| {mode} | {rank} | {peaks[middle]} | {afters[middle]} | {trims[middle]} | {held:,} |")
    same = all(
        abs(a[rank]["checksum"] - b[rank]["checksum"]) < 1e-6 * max(1.0, abs(a[rank]["checksum"]))
        for a, b in zip(results["every-process-loads"], results["rank-0-loads"], strict=True)
        for rank in (0, 1)
    )
    print(f"each rank's shard holds the same values in both settings: {same}")
    for mode, rounds in results.items():
        for rank in (0, 1):
            ratio = [r[rank]["peak_above_mib"] for r in rounds]
            print(f"{mode} rank {rank} peaks above baseline by round: {ratio}")


if __name__ == "__main__":
    main()
