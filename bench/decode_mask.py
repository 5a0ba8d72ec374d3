"""The decode loop's attention mask: the padding mask handed to SDPA in 4-D (what
`sampling.decode_from` does) against the 2-D mask transformers expands itself at every step.

GRPO's sampling on the tiny test model, as `bench/grpo_vs_trl.py` runs it: 8 prompts of
different lengths (so rows are left-padded), 8 samples each, 32 new tokens, fp32, one torch
thread. The two run alternately in one process (which goes first alternates too) with the
same seeds, so machine noise hits both alike and their tokens can be compared; each
`sample()` call (its prefill and its decode loop) is timed by the process's CPU time.

    .venv/bin/python bench/decode_mask.py [--repeats 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = [f"Write the numbers for order A{i} and ticket {i * 7 % 97}." + " Please." * (i % 4) for i in range(8)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=12, help="samples of each kind, alternating")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.modelprep import tiny_prepare
    from training.trainer import sampling
    from training.trainer.policy import cpu_grouped_attention

    torch.set_num_threads(1)
    cpu_grouped_attention()
    folder = tempfile.TemporaryDirectory(prefix="bench-decode-mask-")
    path = tiny_prepare(Path(folder.name) / "tiny")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [sampling.encode_prompt(tokenizer, [{"role": "user", "content": p}]) for p in PROMPTS]
    four_d = sampling._step_mask
    if four_d(model, torch.ones(1, 2, dtype=torch.long)).dim() != 4:
        raise SystemExit("the decode loop does not take the 4-D mask for this model: nothing to compare")
    kinds = {"4-D padding mask": four_d, "2-D mask": lambda _model, mask: mask}

    def draw(seed: int):
        generators = [torch.Generator().manual_seed(seed * 100 + i) for i in range(len(prompts))]
        return sampling.sample(
            model, tokenizer, prompts, num_samples=args.group, max_new_tokens=args.new_tokens, generators=generators
        ).response_ids

    times: dict[str, list[float]] = {k: [] for k in kinds}
    same = True
    try:
        for repeat in range(args.repeats + 1):
            tokens = {}
            order = list(kinds.items())
            for name, step_mask in order if repeat % 2 else order[::-1]:
                sampling._step_mask = step_mask
                started = time.process_time()
                tokens[name] = draw(repeat)
                if repeat:  # the first round warms both up
                    times[name].append(time.process_time() - started)
            same &= torch.equal(*tokens.values())
    finally:
        sampling._step_mask = four_d
    medians = {k: statistics.median(v) for k, v in times.items()}
    rows = len(prompts) * args.group
    print(f"{rows} rows x {args.new_tokens} new tokens, {args.repeats} samples each, median CPU time a sample:")
    for name, value in medians.items():
        print(f"  {name}: {value:.4f} s")
    print(f"ratio 4-D / 2-D: {medians['4-D padding mask'] / medians['2-D mask']:.2f}; the same tokens: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
