"""Training step time of a data-parallel job: one process against two (torchrun, gloo, CPU),
replicated and sharded (`"sharding": "fsdp"`), the same global batch, measured side by side
in one run.

Each setting runs `run_training` (the jobs' loop: SFT and turn-level GRPO) under
`torchrun --standalone --nproc-per-node N` on a random Qwen2-shaped model with the tiny
model's tokenizer, one torch thread per process, LoRA on all linear layers. The runs
alternate (1, 2, 1, 2, …) so a change in the machine's load hits both alike; each
reports the median `step_seconds` of rank 0 after a warm-up step. Speed-up = the
one-process median over the two-process median (> 1: two processes are faster). For each
setting rank 0 also reports the model weights it holds after setup (a sharded process
holds its shard) and its peak resident memory (which includes loading the whole model).

    .venv/bin/python bench/ddp_step.py [--rounds 2] [--steps 6] [--shapes tiny larger]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {
    # the tests' tiny model
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "heads": 2, "kv": 1},
    # ~ 21M parameters besides the embeddings: a step is compute, not launch overhead
    "larger": {"hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 6, "heads": 8, "kv": 2},
    # ~ 270M parameters (1.1 GB in float32): loading it shows in a process's memory
    # (bench/sharded_load.py)
    "load": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 24, "heads": 16, "kv": 4},
}


def model_dir(shape: str, root: Path) -> Path:
    """A random model of `shape` with the tiny tokenizer, saved once under `root`."""
    dest = root / shape
    if (dest / "config.json").exists():
        return dest
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from training.modelprep import tiny_prepare

    tiny = tiny_prepare(root / "tiny-source")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    s = SHAPES[shape]
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=s["hidden_size"],
        intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_hidden_layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv"],
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


def worker(args) -> None:
    """One process of one setting (under torchrun): run the loop, rank 0 writes its figures."""
    import torch

    from training.trainer.config import GRPOConfig, SFTConfig
    from training.trainer.distill import sft_train
    from training.trainer.grpo import grpo_train
    from training.trainer.items import TurnItem, grader_scorer
    from training.trainer.parallel import process_exit, process_group_close, process_group_init
    from training.trainer.policy import load_policy
    from training.trainer.run import setup_torch
    from training.trainer.sharding import held

    torch.set_num_threads(1)
    ranks = process_group_init(cuda=False, timeout_seconds=600)
    items = [
        TurnItem(
            id=f"item-{k}",
            messages=[{"role": "user", "content": f"Where is order A{1000 + k}? It was due on day {k}."}],
            reference="e",
            grader="contains",
            target=f"Order A{1000 + k} left the warehouse on day {k} and arrives within three days. " * 2,
        )
        for k in range(32)
    ]
    common = dict(
        model_path=args.model,
        steps=args.steps + 1,
        prompts_per_step=args.batch,
        max_new_tokens=24,
        eval_every=0,
        checkpoint_every=0,
        samples_every=0,
        learning_rate=1e-4,
        processes=ranks.size,
        sharding=args.sharding,
    )
    with tempfile.TemporaryDirectory() as run_dir:
        if args.kind == "sft":
            config = SFTConfig(**common)
            setup_torch(config)  # seeded before the adapter is drawn, as the loop would
            policy = load_policy(config)  # the loop shards it in place (`trainer_setup`)
            result = sft_train(config=config, items=items, run_dir=Path(run_dir), export=False, policy=policy)
        else:
            config = GRPOConfig(**common, group_size=4)
            setup_torch(config)
            policy = load_policy(config, reference=True)
            result = grpo_train(
                config=config, items=items, score=grader_scorer(), run_dir=Path(run_dir), export=False, policy=policy
            )
    if ranks.owner:
        seconds = [h["step_seconds"] for h in result.history[1:]]  # the first step warms up
        local, _ = held(policy.model)
        figures = {
            "step_seconds": seconds,
            "loss": result.history[-1]["loss"],
            "weights_held": local,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }
        Path(args.out).write_text(json.dumps(figures))
    process_group_close()
    process_exit(0)


def run_setting(kind: str, model: Path, processes: int, sharding: str, steps: int, batch: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    command += [__file__, "--worker", "--kind", kind, "--model", str(model), "--out", str(out)]
    command += ["--steps", str(steps), "--batch", str(batch), "--sharding", sharding]
    env = os.environ | {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} with {processes} processes failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    figures = json.loads(out.read_text())
    out.unlink()
    return figures


SETTINGS = [(1, "replicate"), (2, "replicate"), (2, "fsdp")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=8, help="items in a global batch")
    parser.add_argument("--shapes", nargs="+", default=["tiny", "larger"], choices=sorted(SHAPES))
    parser.add_argument("--kinds", nargs="+", default=["sft", "grpo"], choices=["sft", "grpo"])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--sharding", default="replicate", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"cores: {os.cpu_count()}, load average before: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as root:
        for shape in args.shapes:
            model = model_dir(shape, Path(root))
            for kind in args.kinds:
                seconds: dict[tuple, list[float]] = {s: [] for s in SETTINGS}
                last: dict[tuple, dict] = {}
                for _ in range(args.rounds):
                    for setting in SETTINGS:
                        figures = run_setting(kind, model, *setting, args.steps, args.batch)
                        seconds[setting] += figures["step_seconds"]
                        last[setting] = figures
                one = statistics.median(seconds[SETTINGS[0]])
                print(f"{shape:6} {kind:4} global batch {args.batch}, {len(seconds[SETTINGS[0]])} steps each:")
                for setting in SETTINGS:
                    median = statistics.median(seconds[setting])
                    f = last[setting]
                    print(
                        f"  {setting[0]} process(es), {setting[1]:9}: {median:.3f} s/step, speed-up {one / median:.2f}x; "
                        f"rank 0 holds {f['weights_held']:,} weights, peak RSS {f['peak_rss_mib']:.0f} MiB; "
                        f"last loss {f['loss']:.5f}"
                    )
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
