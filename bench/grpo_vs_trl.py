"""Our GRPO step vs TRL's GRPOTrainer, on the same model and the same prompts.

8 prompts x 8 samples x 32 new tokens per step, beta = 0, full fine-tuning at the same
learning rate for both, run alternately in one process: a block of our steps, then a
block of TRL's, and so on, so machine noise hits both alike. Ours runs twice: with the
job's defaults (the KL to the starting model logged, its reference pass only at the
steps that evaluate and the last one: `GRPOConfig.reference_due`), and "ours, KL every
step", the reference pass at every step, as a job with a KL budget (or any job with the
KL logged, before) runs it. The reward (the share of vowels in the answer) is learnable
from scratch, so the learning curves can be compared. Each step is timed by the wall
clock and by the process's CPU time (the trainers take turns, so it is the running one's;
on a shared CPU machine it is the steadier figure). On the CPU: the tiny test model, fp32,
one torch thread. On a GPU (`--device cuda`): a random model of SmolLM2-135M's or
Qwen2.5-0.5B's shape (`--shape`, built here as `scripts/gpu_check.py` builds it), bf16,
both trainers sampling with their built-in `generate` paths; `scripts/gpu_check.sh` runs
it when TRL is installed. bench/README.md says how to read the output.

    .venv/bin/python bench/grpo_vs_trl.py [--steps 24] [--block 4]
    python bench/grpo_vs_trl.py --device cuda --shape smollm2-135m [--steps 12]

Needs TRL (requirements-bench.txt); it is a benchmark dependency only.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = [f"Write the numbers for order A{i} and ticket {i * 7 % 97}." for i in range(64)]
PROMPTS_PER_STEP, GROUP, NEW_TOKENS = 8, 8, 32


def vowel_share(text: str) -> float:
    """The reward: the share of the answer's characters that are lowercase vowels."""
    return sum(c in "aeiou" for c in text) / max(len(text), 1)


class Ours:
    """Our loop in a thread, paused after each step so the two trainers alternate."""

    def __init__(
        self, model_dir: Path, steps: int, lr: float, seed: int, device: str = "cpu", kl_every_step: bool = False
    ):
        from training.trainer.common import Hooks
        from training.trainer.config import GRPOConfig, MonitorConfig
        from training.trainer.items import TurnItem

        self.times: list[float] = []
        self.updates: list[float] = []
        self.rewards: list[float] = []
        self.go = threading.Semaphore(0)
        self.done_step = threading.Semaphore(0)
        items = [TurnItem(id=f"p{i}", messages=[{"role": "user", "content": p}]) for i, p in enumerate(PROMPTS)]
        config = GRPOConfig(
            model_path=str(model_dir),
            adapter="full",
            learning_rate=lr,
            steps=steps,
            prompts_per_step=PROMPTS_PER_STEP,
            group_size=GROUP,
            max_new_tokens=NEW_TOKENS,
            temperature=1.0,
            beta=0.0,
            # A budget no KL reaches: the monitor never fires, but it reads the KL every step.
            monitors=MonitorConfig(kl_budget=1e9 if kl_every_step else None),
            eval_every=0,
            checkpoint_every=0,
            samples_every=0,
            seed=seed,
            device=device,
            dtype="bfloat16" if device == "cuda" else "float32",
        )

        update_started = [0.0]

        def on_phase(phase: str, done: int, total: int) -> None:
            if phase == "update":
                update_started[0] = time.thread_time()

        def on_step(step: int, m: dict) -> None:
            self.times.append(m["step_seconds"])
            # The loop's own thread: its CPU time is the update's, whatever else the machine runs.
            self.updates.append(time.thread_time() - update_started[0])
            self.rewards.append(m["reward_mean"])
            self.done_step.release()
            self.go.acquire()

        def score(item, candidates):
            return [vowel_share(c) for c in candidates]

        def run() -> None:
            from training.trainer.grpo import grpo_train

            self.go.acquire()
            grpo_train(
                config=config,
                items=items,
                score=score,
                run_dir=Path(tempfile.mkdtemp(prefix="bench-ours-")),
                hooks=Hooks(on_step=on_step, on_phase=on_phase),
                export=False,
            )
            self.done_step.release()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def step(self) -> None:
        self.go.release()
        self.done_step.acquire()


class Trl:
    """TRL's GRPOTrainer driven one optimiser step at a time, as its own loop does."""

    def __init__(self, model_dir: Path, steps: int, lr: float, seed: int, device: str = "cpu"):
        import torch
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from trl import GRPOConfig, GRPOTrainer

        self.times: list[float] = []
        self.rewards: list[float] = []
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.bfloat16 if device == "cuda" else torch.float32
        )
        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in PROMPTS])

        def reward(completions, **kwargs):
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            values = [vowel_share(t) for t in texts]
            self._last_rewards = values
            return values

        args = GRPOConfig(
            output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
            per_device_train_batch_size=PROMPTS_PER_STEP * GROUP,
            num_generations=GROUP,
            max_completion_length=NEW_TOKENS,
            learning_rate=lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            beta=0.0,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_steps=steps,
            logging_steps=10**6,
            save_strategy="no",
            report_to="none",
            use_cpu=device == "cpu",
            bf16=device == "cuda",
            fp16=False,
            seed=seed,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        self.trainer = GRPOTrainer(
            model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer
        )
        self.trainer.create_optimizer_and_scheduler(num_training_steps=steps)
        # Set by Trainer's own loop, which this drives step by step.
        self.trainer.current_gradient_accumulation_steps = args.gradient_accumulation_steps
        self.trainer.model.train()
        self.batches = iter(self.trainer.get_train_dataloader())

    def step(self) -> None:
        trainer = self.trainer
        started = time.perf_counter()
        batch = next(self.batches, None)
        if batch is None:  # a new epoch over the prompts
            self.batches = iter(trainer.get_train_dataloader())
            batch = next(self.batches)
        trainer.training_step(trainer.model, batch, None)
        trainer.accelerator.clip_grad_norm_(trainer.model.parameters(), trainer.args.max_grad_norm)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        trainer.model.zero_grad(set_to_none=True)
        self.times.append(time.perf_counter() - started)
        self.rewards.append(statistics.fmean(self._last_rewards))


def model_of_shape(shape: str, root: Path) -> Path:
    """The tiny test model, or a random one of a `scripts/gpu_check.py` shape with the tiny
    tokenizer, saved once under `root`."""
    from training.modelprep import tiny_prepare

    if shape == "tiny":
        return tiny_prepare(root / "tiny")
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    if shape not in gpu_check.SHAPES:
        raise SystemExit(f"--shape must be tiny or one of {', '.join(gpu_check.SHAPES)}")
    dest = root / shape
    if not (dest / "config.json").exists():
        tokenizer = gpu_check.build_tokenizer(root / f"{shape}-tokenizer")
        torch.manual_seed(0)
        gpu_check.build_model(gpu_check.SHAPES[shape], tokenizer, torch.bfloat16).save_pretrained(dest)
        tokenizer.save_pretrained(dest)
    return dest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=24, help="optimiser steps for each trainer")
    parser.add_argument("--block", type=int, default=4, help="steps of one trainer before switching")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--shape", default="tiny", help="tiny, or a shape of scripts/gpu_check.py (smollm2-135m, …)")
    args = parser.parse_args()

    import torch
    import transformers
    import trl

    torch.set_num_threads(1)
    model_dir = model_of_shape(args.shape, ROOT / "var" / "bench")
    precision = "bf16" if args.device == "cuda" else "fp32, 1 thread"
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, trl {trl.__version__}; "
        f"{args.shape} on {args.device}, {PROMPTS_PER_STEP} prompts x {GROUP} samples x {NEW_TOKENS} new tokens, "
        f"{precision}, beta 0, lr {args.lr}, {args.steps} steps each in blocks of {args.block}",
        flush=True,
    )
    ours = Ours(model_dir, args.steps, args.lr, args.seed, args.device)
    every = Ours(model_dir, args.steps, args.lr, args.seed, args.device, kl_every_step=True)
    theirs = Trl(model_dir, args.steps, args.lr, args.seed, args.device)
    trainers = {"ours": ours, "ours, KL every step": every, "TRL": theirs}
    # The process's CPU time over a step is that trainer's alone (the others wait on their
    # turn), and unlike the wall clock it does not grow with other processes' load.
    cpu: dict[str, list[float]] = {name: [] for name in trainers}
    for start in range(0, args.steps, args.block):
        for name, trainer in trainers.items():
            for _ in range(min(args.block, args.steps - start)):
                before = time.process_time()
                trainer.step()
                cpu[name].append(time.process_time() - before)
        print(
            f"after {start + args.block:3d} steps: "
            + ", ".join(
                f"{name} {statistics.median(t.times):.3f} s/step (reward {t.rewards[-1]:.3f})"
                for name, t in trainers.items()
            ),
            flush=True,
        )
    for trainer in (ours, every):
        trainer.go.release()
        trainer.thread.join(timeout=60)

    # The first step of each pays for warm-up (allocations, lazy inits).
    medians = {name: statistics.median(t.times[1:]) for name, t in trainers.items()}
    cpu_medians = {name: statistics.median(times[1:]) for name, times in cpu.items()}
    tail = max(1, args.steps // 4)
    print("\nstep  ours_s  every_s  trl_s  ours_cpu  every_cpu  trl_cpu  ours_reward  every_reward  trl_reward")
    walls = zip(ours.times, every.times, theirs.times, strict=True)
    rewards = zip(ours.rewards, every.rewards, theirs.rewards, strict=True)
    for i, ((a, b, c), (ca, cb, cc), (ra, rb, rc)) in enumerate(
        zip(walls, zip(*cpu.values(), strict=True), rewards, strict=True), 1
    ):
        print(
            f"{i:4d}  {a:6.3f}  {b:7.3f}  {c:5.3f}  {ca:8.3f}  {cb:9.3f}  {cc:7.3f}  {ra:11.3f}  {rb:12.3f}  {rc:10.3f}"
        )

    update, update_every = statistics.median(ours.updates[1:]), statistics.median(every.updates[1:])

    def ratios(m: dict[str, float]) -> str:
        return (
            f"ours {m['ours'] / m['TRL']:.2f} (goal <= 0.40), "
            f"ours with the KL every step {m['ours, KL every step'] / m['TRL']:.2f}"
        )

    print(
        "\nmedian step time: "
        + ", ".join(f"{name} {m:.3f} s" for name, m in medians.items())
        + f"\nratio to TRL: {ratios(medians)}\n"
        "median CPU time a step: "
        + ", ".join(f"{name} {m:.3f} s" for name, m in cpu_medians.items())
        + f"\nratio to TRL, CPU time: {ratios(cpu_medians)}\n"
        f"ours' update phase, CPU time (median): {update:.3f} s, {update_every:.3f} s with the KL every step "
        f"(the reference's pass: {1 - update / update_every:.0%} of that update)\n"
        "mean reward, "
        + "; ".join(
            f"{name}: first {tail} steps {statistics.fmean(t.rewards[:tail]):.3f}, "
            f"last {tail} {statistics.fmean(t.rewards[-tail:]):.3f}"
            for name, t in trainers.items()
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
