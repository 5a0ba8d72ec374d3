"""What a LoRA job on Qwen2.5-0.5B, 7B or 32B needs per GPU: memory on 1 GPU (each process
holds the whole model: one process, or `processes` N replicated) and on N = 2, 4, 8 GPUs
with FSDP2 (`fully_shard`: the weights, the adapter's gradients and its optimizer state
split over the N processes), the largest micro-batch that fits an 80 GB and a 141 GB card,
the sampler's key/value cache, and the training throughput at an assumed utilisation.

No GPU is used. Each figure says where it comes from:

- MEASURED: counted by this script. Parameter counts and dtypes from the models built on
  the `meta` device from the public configs and wrapped by the product's own `load_policy`
  (peft LoRA, the job defaults: rank 16, alpha 32, all linear layers, bfloat16 weights);
  the bytes autograd saves for the backward pass and the key/value cache per token, from a
  forward pass on the CPU of each model's real shapes with 2 of its decoder layers; the
  peak memory of a whole forward/backward of a small Qwen2-shaped model on the CPU (peak
  RSS of a process of its own).
- ESTIMATED: a formula, stated where it is computed: what autograd keeps per decoder
  layer (the measured tensors, as a function of hidden size, intermediate size and rank;
  checked against the measurements), the backward pass's temporaries on the logits, the
  FSDP2 layout, the headroom, and the FLOPs rule with an assumed utilisation.

    .venv/bin/python bench/memory_recipe.py [--seq 1024] [--response 256] [--mfu 0.35] [--json]

`--seq`: tokens per training sequence (prompt + response). SFT computes logits on every
position; GRPO on the response only (`--response`, its `max_new_tokens`), so its logits
term is smaller. About 30 s of CPU time (`--no-checks`: the tables alone, a few seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
# The recipe's halves sit beside it in bench/, which is not on the path when a test loads
# this file by its path; last, so that bench's modules shadow nothing.
sys.path.append(str(ROOT / "bench"))

from memory_formulas import (  # noqa: E402
    CARDS_MIB,
    GIB,
    JOBS,
    PEAK_TFLOPS,
    ROLLOUT_SEQUENCES,
    fit_key,
    head_dim,  # noqa: F401  (the tests read every figure from this module)
    head_saved,
    kv_cache_per_token,
    layer_saved_per_token,
    peak_per_sequence,
    recipe,
    shared_saved,
    static_per_gpu,  # noqa: F401
)
from memory_measured import (  # noqa: E402
    MODELS,
    SMALL,
    SMALL_LAYERS,
    Counts,
    count,
    measure_peak,
    measure_saved,
    peak_one,
)

# --- printing ----------------------------------------------------------------------------------


def print_recipe(r: dict, shape: dict, args: argparse.Namespace) -> None:
    c = Counts(**r["counts"])
    tied = "tied" if shape["tied"] else "untied"
    print(
        f"\n== {r['model']}: hidden {shape['hidden']}, {shape['layers']} layers, {shape['heads']} heads / "
        f"{shape['kv_heads']} kv heads, intermediate {shape['intermediate']}, vocab {shape['vocab']}, {tied}"
    )
    print(
        f"MEASURED  {c.params:,} parameters (published {shape['published'] / 1e9:.2f}B: "
        f"{100 * (c.params / shape['published'] - 1):+.1f} %); LoRA r={c.lora_rank} alpha={c.lora_alpha} "
        f"{c.lora_target}: {c.lora:,} trainable, fp{8 * c.lora_bytes_each}"
    )
    print(
        f"MEASURED  base weights {c.base_bytes / GIB:.2f} GiB (bf16); a decoder layer {c.block_params / 1e6:.1f}M "
        f"parameters; the root (embeddings, final norm, output layer) {c.root_params / 1e6:.1f}M"
    )
    act = r["activation_per_sequence_gib"]
    print(
        f"ESTIMATED activations at the peak, per sequence: GRPO {act['grpo']:.2f} GiB "
        f"({act['grpo ckpt']:.2f} with activation checkpointing), SFT {act['sft']:.2f} GiB ({act['sft ckpt']:.2f})"
    )
    print(
        f"ESTIMATED per GPU, GiB; largest batches on an {' / '.join(CARDS_MIB)} card with {args.headroom:.0%} headroom"
    )
    print(f"  {'':<40}{'1 GPU':>8}{'FSDP2 2':>9}{'4':>6}{'8':>6}")

    def line(label: str, key: str, fmt: str) -> None:
        cells = ["-" if key == "in_flight" and row["gpus"] == 1 else format(row[key], fmt) for row in r["per_gpu"]]
        print(f"  {label:<40}{cells[0]:>8}{cells[1]:>9}{cells[2]:>6}{cells[3]:>6}")

    line("base weights (bf16)", "base", ".1f")
    line("LoRA weights, grads, AdamW (fp32)", "lora", ".1f")
    line("unsharded in flight (root + 2 layers)", "in_flight", ".1f")
    line("static total", "static", ".1f")
    line(f"sampling: static + KV cache, {ROLLOUT_SEQUENCES} seqs", "sampler", ".1f")
    for ck in (False, True):
        if ck:
            print("  with activation checkpointing (not a job setting today):")
        for job, label in JOBS.items():
            for card in CARDS_MIB:
                line(f"{label}, {card}", fit_key(job, card, ck), "d")
    flops = r["forward_flops_per_token"]
    print(
        f"ESTIMATED FLOPs per token of a forward pass: SFT {flops['sft'] / 1e9:.1f} G, GRPO {flops['grpo'] / 1e9:.1f} G "
        "(2 per weight used + attention); an update = 2 forward passes (4 x params x tokens: the backward "
        "pass reaches the activations, the frozen weights get no gradient), GRPO adds its reference pass (3)"
    )
    print(
        f"ESTIMATED throughput at {args.mfu:.0%} of {PEAK_TFLOPS:.0f} TFLOP/s: SFT {r['sft_tokens_per_s_per_gpu']:,.0f} "
        f"tokens/s per GPU, GRPO update {r['grpo_tokens_per_s_per_gpu']:,.0f}; N GPUs: N times; sampling not included"
    )


def print_checks(checks: dict) -> None:
    print("\nFormula vs measurement (CPU, bf16 weights, LoRA as a job wraps it)")
    print("  MEASURED bytes saved for the backward pass, 2 decoder layers of each shape, one row left-padded:")
    print(
        f"  {'shape':<18}{'B':>2}{'L':>4}{'scored':>7}{'per layer per token':>24}{'first layer extra + head, per seq':>40}"
    )
    print(f"  {'':<31}{'measured':>13}{'formula':>11}{'measured':>20}{'formula':>20}")
    for name, m in checks["saved"].items():
        print(
            f"  {name:<18}{m['batch']:>2}{m['seq']:>4}{m['scored']:>7}{m['layer_per_token']:>13,.0f}"
            f"{m['layer_formula']:>11,.0f}{m['rest_per_sequence']:>20,.0f}{m['rest_formula']:>20,.0f}"
        )
    print("  MEASURED key/value cache per token, all layers (bytes):")
    for name, m in checks["saved"].items():
        if name in MODELS:
            print(f"  {name:<18}measured {m['kv_per_token']:>9,.0f}   formula {m['kv_formula']:>9,.0f}")
    print(
        f"  MEASURED peak of a whole forward/backward, small model (hidden {SMALL['hidden']}, "
        f"{SMALL['layers']} layers): peak RSS over the RSS before"
    )
    for p in checks["peaks"]:
        for mode, m in p["runs"].items():
            note = "" if m["valid"] else "  (peak not started over: no measurement)"
            print(
                f"    {p['shape']:<36}{mode:<18} measured {m['measured'] / 2**20:7.1f} MiB   "
                f"formula {m['formula'] / 2**20:7.1f} MiB   formula / measured {m['formula'] / m['measured']:.2f}{note}"
            )


def checks(rank: int) -> dict:
    """The CPU measurements beside what the formulas give for them."""
    peaks = []
    for shape, batch, seq in ((SMALL, 8, 256), (SMALL_LAYERS, 8, 512)):
        runs = measure_peak(shape, batch=batch, seq=seq, scored=seq - 1)
        for mode, m in runs.items():
            ck = mode == "checkpointing"
            m["formula"] = batch * peak_per_sequence(shape, rank, seq, seq - 1, checkpointing=ck)
        described = f"vocab {shape['vocab']}, B={batch}, L={seq}, {seq - 1} scored"
        peaks.append({"shape": described, "runs": runs})
    saved = {}
    shapes = {**MODELS, "small (32 scored)": SMALL}
    for name, shape in shapes.items():
        m = measure_saved(shape, batch=2, scored=32) if shape is SMALL else measure_saved(shape)
        m["layer_formula"] = layer_saved_per_token(shape, rank, m["seq"])
        m["rest_per_sequence"] = m["shared_per_sequence"] + m["head_per_sequence"]
        m["rest_formula"] = shared_saved(shape, m["seq"]) + head_saved(shape, m["seq"], m["scored"])
        m["kv_formula"] = kv_cache_per_token(shape)
        saved[name] = m
    return {"saved": saved, "peaks": peaks}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=1024, help="tokens per training sequence (prompt + response)")
    parser.add_argument("--response", type=int, default=256, help="GRPO: response tokens (max_new_tokens)")
    parser.add_argument("--mfu", type=float, default=0.35, help="assumed model-FLOPs utilisation")
    parser.add_argument("--headroom", type=float, default=0.10, help="share of each card left free")
    parser.add_argument("--no-checks", action="store_true", help="skip the CPU measurements")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--peak-one", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_one is not None:
        spec = json.loads(args.peak_one)
        print(json.dumps(peak_one(spec.pop("shape"), **spec)))
        return
    if not 1 <= args.response < args.seq:
        parser.error("--response must be between 1 and --seq - 1")
    counts = {name: count(shape) for name, shape in MODELS.items()}
    results = {name: recipe(name, MODELS[name], c, args) for name, c in counts.items()}
    measured = None if args.no_checks else checks(counts["Qwen2.5-0.5B"].lora_rank)
    if args.json:
        print(json.dumps({"models": results, "checks": measured}, indent=1))
        return
    print(
        f"Sequences of {args.seq} tokens (GRPO: {args.seq - args.response} prompt + {args.response} response); "
        "bf16 weights, fp32 adapters; 'sampling' holds a GRPO step's "
        f"{ROLLOUT_SEQUENCES} rollouts (prompts_per_step 4 x group_size 8), split over the GPUs."
    )
    for name, r in results.items():
        print_recipe(r, MODELS[name], args)
    if measured:
        print_checks(measured)


if __name__ == "__main__":
    main()
