"""The turn-level GRPO update's peak memory by `micro_batch`: one forward/backward pass over
the whole batch vs the same gradient accumulated a few sequences at a time.

A random 20M-parameter Qwen2-shaped model with a 32k vocabulary (the logits dominate), fp32,
one torch thread, 64 sequences of 32 prompt + 64 response tokens, the "token" normaliser.
Each setting runs in a process of its own (peak RSS is per process), one after another,
and the losses are compared: they must be equal, as the gradients are.

    .venv/bin/python bench/micro_batch_memory.py [--sizes 0 16 4]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one(micro: int) -> dict:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from training.trainer.common import micro_batches
    from training.trainer.config import GRPOConfig
    from training.trainer.grpo import turn_loss_backward

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=32000,
            hidden_size=256,
            intermediate_size=704,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            tie_word_embeddings=True,
        )
    )
    rows, prompt, response = 64, 32, 64
    ids = torch.randint(0, 32000, (rows, prompt + response))
    config = GRPOConfig(model_path="unused", normaliser="token", temperature=1.0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    out = turn_loss_backward(
        model,
        ids,
        torch.ones_like(ids),
        torch.ones(rows, response),
        torch.randn(rows),
        chunks=micro_batches(rows, micro),
        config=config,
        constant=rows * response,
    )
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"micro_batch": micro, "update_mib": (peak - before) / 1024, "seconds": seconds, "loss": out["loss"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 16, 4])
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one)))
        return
    results = []
    for size in args.sizes:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(size)], check=True, capture_output=True, text=True
        ).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    whole = results[0]
    print("micro_batch  update peak (MiB)  vs first  seconds  loss")
    for r in results:
        print(
            f"{r['micro_batch']:>11}  {r['update_mib']:>17.0f}  {r['update_mib'] / whole['update_mib']:>8.2f}"
            f"  {r['seconds']:>7.1f}  {r['loss']:.6f}"
        )
    same = all(abs(r["loss"] - whole["loss"]) <= 1e-5 * max(1.0, abs(whole["loss"])) for r in results)
    print(f"same loss in every setting: {same}")


if __name__ == "__main__":
    main()
