"""The sampler's two decode loops side by side: eager `decode_from` vs fixed-shape `static_decode_from`.

A random-weight model built here from a shape (no download): by default a small Qwen2
(hidden 256, 6 layers, 6.8M parameters) for a CPU; `--shape smollm2` is SmolLM2-135M's
(hidden 576, 30 layers, 9 heads, 3 key/value heads, intermediate 1536, vocab 49152).
N contexts share a 64-token prefix and differ in their last 8 to 40 tokens; each gets G
copies after one prefill (not timed), then every row decodes `--new-tokens` tokens (no
end token, so both loops take the same steps). The loops run alternately in one process
with generators seeded alike, so machine noise hits both and their tokens can be
compared; the first run of each is a warm-up. `--compile` (CUDA only) compiles the
static loop's one-token step into CUDA graphs (`torch.compile(mode="reduce-overhead")`).
fp32 on a CPU, bf16 on a GPU.

On a CPU under Linux the static loop can lose to page faults, not to compute: each step
transformers expands the key/value heads of the whole cache width to the query heads
(11 MB of keys and 11 MB of values a layer here), and glibc may hand such blocks back to the kernel on free
and fault them in again on the next step (two million minor faults and 0.6x the eager
loop's rate in some processes, ~1.05x in others). Keeping freed memory in the process
measures the loops themselves:

    .venv/bin/python bench/static_decode.py [--contexts 8] [--copies 8] [--new-tokens 64] [--repeats 3] [--threads 1]
    MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 .venv/bin/python bench/static_decode.py
    python bench/static_decode.py --device cuda --shape smollm2 --compile [--new-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SMALL = dict(
    arch="qwen2",
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=6,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=8192,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--shape", choices=["small", "smollm2"], default="small")
    parser.add_argument("--contexts", type=int, default=8, help="distinct contexts (N)")
    parser.add_argument("--copies", type=int, default=8, help="samples per context (G)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each loop, after a warm-up")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on a CPU")
    parser.add_argument("--compile", action="store_true", help="compile the static loop's step (CUDA only)")
    args = parser.parse_args()

    import torch

    from scripts.gpu_check import SHAPES, build_model, build_tokenizer, compare_samplers, sampler_contexts

    if args.compile and args.device != "cuda":
        parser.error("--compile needs --device cuda: it records CUDA graphs, which a CPU has no use for")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device visible to torch")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = build_tokenizer(Path(folder))
    shape = SMALL if args.shape == "small" else SHAPES["smollm2-135m"]
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    model = build_model(shape, tokenizer, dtype).to(args.device).eval()
    params = sum(p.numel() for p in model.parameters()) / 1e6
    contexts = sampler_contexts(args.contexts, prefix=64, vocab=len(tokenizer))
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else f"cpu, {args.threads} thread(s)"
    print(
        f"model: random {args.shape} shape ({params:.1f}M parameters), {str(dtype).replace('torch.', '')}, {where}; "
        f"{args.contexts} contexts x {args.copies} copies, {args.new_tokens} new tokens, "
        f"static loop {'compiled' if args.compile else 'eager'}",
        flush=True,
    )
    summary = compare_samplers(
        model, contexts, copies=args.copies, new_tokens=args.new_tokens, compile=args.compile, repeats=args.repeats
    )
    print(json.dumps({"shape": args.shape, "device": args.device, "threads": args.threads, **summary}))
    print(
        f"generated tokens/s: decode_from {summary['eager_tokens_per_s']:.1f}, "
        f"static_decode_from {summary['static_tokens_per_s']:.1f}, "
        f"ratio static/eager {summary['ratio_static_over_eager']:.2f}; same tokens: {summary['same_tokens']}"
    )
    cpu_ratio = summary["static_tokens_per_cpu_s"] / summary["eager_tokens_per_cpu_s"]
    print(
        f"per CPU second of this process: decode_from {summary['eager_tokens_per_cpu_s']:.1f}, "
        f"static_decode_from {summary['static_tokens_per_cpu_s']:.1f}, ratio static/eager {cpu_ratio:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
