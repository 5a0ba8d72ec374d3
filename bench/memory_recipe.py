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
import math
import os
import subprocess
import sys
import types
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GIB = 2**30

# Public configs (config.json of each Hugging Face model) and the parameter counts on their
# model cards ("Number of Parameters").
MODELS: dict[str, dict] = {
    # Qwen/Qwen2.5-0.5B
    "Qwen2.5-0.5B": {
        "hidden": 896,
        "intermediate": 4864,
        "layers": 24,
        "heads": 14,
        "kv_heads": 2,
        "vocab": 151936,
        "tied": True,
        "published": 0.49e9,
    },
    # Qwen/Qwen2.5-7B
    "Qwen2.5-7B": {
        "hidden": 3584,
        "intermediate": 18944,
        "layers": 28,
        "heads": 28,
        "kv_heads": 4,
        "vocab": 152064,
        "tied": False,
        "published": 7.61e9,
    },
    # Qwen/Qwen2.5-32B
    "Qwen2.5-32B": {
        "hidden": 5120,
        "intermediate": 27648,
        "layers": 64,
        "heads": 40,
        "kv_heads": 8,
        "vocab": 152064,
        "tied": False,
        "published": 32.5e9,
    },
}

# The small model whose whole forward/backward is measured (the one of micro_batch_memory.py).
SMALL = {"hidden": 256, "intermediate": 704, "layers": 4, "heads": 4, "kv_heads": 2, "vocab": 32000, "tied": True}

# The same with a small vocabulary: the layers, not the logits, set the peak.
SMALL_LAYERS = {**SMALL, "vocab": 512}

# Cards, as nvidia-smi reports their memory (ASSUMED): an 80 GB H100/A100, a 141 GB H200.
CARDS_MIB = {"80 GB": 81559, "141 GB": 143771}
# H100 SXM and H200: 989 TFLOP/s dense bfloat16 (NVIDIA's data sheets, without sparsity).
PEAK_TFLOPS = 989.0
# The sequences one GRPO step samples with the defaults: prompts_per_step 4 x group_size 8.
ROLLOUT_SEQUENCES = 32
# Backward-pass temporaries on the logits, bytes per scored position and vocabulary entry:
# the gradient of the log-sum-exp, grad x exp(logits - lse), makes three fp32 (B, T, V)
# tensors (logits - lse, its exp, the product), alive at once beside the saved fp32 logits.
LOGIT_TRANSIENT_BYTES = 12


def qwen2_config(shape: dict, *, layers: int | None = None, tied: bool | None = None) -> Any:
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=shape["vocab"],
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        num_hidden_layers=layers or shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        max_position_embeddings=32768,
        tie_word_embeddings=shape["tied"] if tied is None else tied,
    )


def head_dim(shape: dict) -> int:
    return shape["hidden"] // shape["heads"]


def product_policy(model: Any, *, device: str) -> tuple[Any, Any]:
    """`model` wrapped as a job wraps it (`load_policy` with the job defaults, bfloat16):
    (the policy, its config)."""
    from training.trainer.config import SFTConfig
    from training.trainer.policy import load_policy

    config = SFTConfig(model_path="unused", device=device, dtype="bfloat16")
    tokenizer = types.SimpleNamespace(pad_token_id=0, eos_token="")
    return load_policy(config, model=model, tokenizer=tokenizer), config


# --- MEASURED: counts on the meta device -------------------------------------------------------


@dataclass
class Counts:
    params: int  # base model, each tensor once (tied embeddings count once)
    lora: int  # trainable adapter parameters
    lora_bytes_each: int  # bytes of one adapter parameter (its dtype)
    base_bytes: int  # base weights at their dtype (bfloat16)
    block_params: int  # one decoder layer (base)
    block_lora: int  # one decoder layer's adapters
    root_params: int  # the rest: embeddings, final norm, output layer
    lora_rank: int
    lora_alpha: int
    lora_target: str


def count(shape: dict) -> Counts:
    """Build the whole model on the meta device, wrap it as a job does, count."""
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        model = Qwen2ForCausalLM(qwen2_config(shape))
    policy, config = product_policy(model, device="meta")
    frozen = [p for p in policy.model.parameters() if not p.requires_grad]
    trained = [p for p in policy.model.parameters() if p.requires_grad]
    block = next(m for n, m in policy.model.named_modules() if n.endswith("model.layers.0"))
    block_frozen = sum(p.numel() for p in block.parameters() if not p.requires_grad)
    params = sum(p.numel() for p in frozen)
    return Counts(
        params=params,
        lora=sum(p.numel() for p in trained),
        lora_bytes_each=trained[0].element_size(),
        base_bytes=sum(p.numel() * p.element_size() for p in frozen),
        block_params=block_frozen,
        block_lora=sum(p.numel() for p in block.parameters() if p.requires_grad),
        root_params=params - shape["layers"] * block_frozen,
        lora_rank=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_target=config.lora_target,
    )


# --- ESTIMATED: what autograd keeps, as a formula ----------------------------------------------


def layer_saved_per_token(shape: dict, rank: int, seq: int) -> int:
    """Bytes one decoder layer keeps for the backward pass, per token of a sequence of
    `seq`: bfloat16 base weights, LoRA (rank `rank`, fp32 as peft keeps it) on all 7 linear
    layers, padded batches (an attention mask is given, so k and v are repeated to every
    head, and attention turns the boolean mask into an additive bf16 one, seq x seq per
    sequence, in every layer).

    Korthikanti et al. 2022 ("Reducing Activation Recomputation", table 2) count 34·h bytes
    per token (+ the attention scores) for a GPT layer; a Qwen2 layer differs: SwiGLU,
    RMSNorm computed in fp32, fused attention (no scores kept), no dropout, frozen base
    weights, and peft's cast of each adapted layer's input to the adapter's fp32."""
    h, i, heads = shape["hidden"], shape["intermediate"], shape["heads"]
    return (
        2 * 4 * h  # the two RMSNorms' inputs, upcast to fp32
        + 4 * (6 * h + i)  # fp32 copies of the adapted layers' inputs: q, k, v, o, gate, up (h), down (i)
        + 7 * 4 * rank  # the adapters' A outputs (fp32)
        + 2 * 4 * h  # attention: q, k, v (repeated to all heads) and its output, bf16
        + 2 * 3 * i  # SwiGLU: gate, silu(gate), up, bf16
        + 2 * 4  # the norms' 1/rms, fp32
        + 4 * heads  # attention's log-sum-exp, fp32
        + 2 * seq  # attention's additive mask, bf16
    )


def shared_saved(shape: dict, seq: int) -> int:
    """Per sequence, kept once for all layers: RoPE's cos and sin (bf16); less the first
    layer's norm input (the frozen embeddings' output needs no gradient)."""
    return 2 * 2 * seq * head_dim(shape) - (4 * shape["hidden"] + 4) * seq


def head_saved(shape: dict, seq: int, scored: int) -> int:
    """Per sequence, after the layers: the final norm (fp32 input, 1/rms) and the token
    ids (int64, gathered from) on every position, and per scored position the fp32 logits
    (`gather_logprobs` upcasts them for the log-sum-exp) and the log-sum-exp."""
    return (4 * shape["hidden"] + 4 + 8) * seq + (4 * shape["vocab"] + 4) * scored


def saved_per_sequence(shape: dict, rank: int, seq: int, scored: int) -> int:
    return (
        shape["layers"] * layer_saved_per_token(shape, rank, seq) * seq
        + shared_saved(shape, seq)
        + head_saved(shape, seq, scored)
    )


def peak_per_sequence(shape: dict, rank: int, seq: int, scored: int, *, checkpointing: bool) -> int:
    """Activation memory at the step's peak (the first steps of the backward pass), per
    sequence of a micro-batch.

    Without checkpointing: everything saved, plus the logits' backward temporaries
    (LOGIT_TRANSIENT_BYTES x vocab per scored position).
    With activation checkpointing of each decoder layer (non-reentrant): each layer keeps
    only its bf16 input (2·h per token); the larger of the logits' temporaries and one
    layer recomputed during the backward pass comes on top, the layer counted at twice its
    saved tensors (them and as much again for its gradients: an upper bound, the CPU
    measurement of a layer-bound model finds less)."""
    logits = LOGIT_TRANSIENT_BYTES * shape["vocab"] * scored
    if not checkpointing:
        return saved_per_sequence(shape, rank, seq, scored) + logits
    kept = shape["layers"] * 2 * shape["hidden"] * seq + shared_saved(shape, seq) + head_saved(shape, seq, scored)
    return kept + max(logits, 2 * layer_saved_per_token(shape, rank, seq) * seq)


def kv_cache_per_token(shape: dict) -> int:
    """Sampler's key/value cache, bytes per token: 2 (k, v) x layers x kv_heads x head_dim x 2 (bf16)."""
    return 2 * shape["layers"] * shape["kv_heads"] * head_dim(shape) * 2


# --- MEASURED: saved tensors and cache at the real shapes, on the CPU --------------------------


def measure_saved(shape: dict, *, layers: int = 2, batch: int = 1, seq: int = 64, scored: int = 63) -> dict:
    """One forward pass of `shape` cut to `layers` decoder layers (tied output layer, to
    hold one vocabulary matrix), bfloat16 on the CPU, wrapped as a job wraps it, through the
    product's `token_logprobs`; left padding on one row. Every tensor autograd saves is
    counted once (by storage), weights excluded, and charged to the layer running when it
    was saved. Also the key/value cache of a forward pass with `use_cache`."""
    import torch
    from transformers import DynamicCache, Qwen2ForCausalLM

    from training.trainer.logprobs import token_logprobs

    config = qwen2_config(shape, layers=layers, tied=True)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    # Left uninitialised (no time spent writing gigabytes): the values change nothing that
    # is kept, only the shapes do.
    model.to_empty(device="cpu")
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)  # its buffer was left empty
    policy, _ = product_policy(model, device="cpu")
    net = policy.model
    weights = {t.untyped_storage()._cdata for t in [*net.parameters(), *net.buffers()]}
    decoder = next(m for n, m in net.named_modules() if n.endswith("model.layers"))
    final_norm = next(m for n, m in net.named_modules() if n.endswith("model.norm"))
    where = ["before"]
    for k, block in enumerate(decoder):
        block.register_forward_pre_hook(lambda *_, k=k: where.__setitem__(0, f"layer{k}"))
    final_norm.register_forward_pre_hook(lambda *_: where.__setitem__(0, "head"))
    seen: dict[int, tuple[str, int]] = {}
    # Every saved storage is held until the count is done: a freed one's address could be
    # reused by a later tensor, which would then be taken for it and not counted.
    held: list = []

    def pack(t):
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in weights and key not in seen:
            seen[key] = (where[0], storage.nbytes())
            held.append(storage)
        return t

    ids = torch.randint(0, shape["vocab"], (batch, seq))
    attention = torch.ones_like(ids)
    attention[0, :4] = 0
    # The recipe's figures are for GPU jobs: transformers' own grouped-query attention, which
    # under a mask copies the key/value heads out (and autograd keeps the copies), not the
    # CPU jobs' `cpu_grouped_attention`, which keeps 2 · (heads - kv heads) · head_dim fewer
    # values a token and layer.
    import transformers.integrations.sdpa_attention as sdpa

    installed = sdpa.use_gqa_in_sdpa
    sdpa.use_gqa_in_sdpa = getattr(installed, "chosen", installed)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            token_logprobs(net, ids, attention, keep=scored)
    finally:
        sdpa.use_gqa_in_sdpa = installed
    by = {}
    for place, nbytes in seen.values():
        by[place] = by.get(place, 0) + nbytes
    with torch.no_grad():
        cache = DynamicCache()
        decoder_only = next(m for n, m in net.named_modules() if n.endswith("model.model"))  # no output layer
        decoder_only(input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=True)
        kv = sum(
            t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values) if t is not None
        )
    last = f"layer{layers - 1}"
    return {
        "layer_per_token": by[last] / (batch * seq),
        "shared_per_sequence": (by["layer0"] - by[last]) / batch,
        "head_per_sequence": by["head"] / batch,
        "kv_per_token": kv / (batch * seq) * shape["layers"] / layers,
        "batch": batch,
        "seq": seq,
        "scored": scored,
    }


# --- MEASURED: a whole step's peak on the CPU, in a process of its own -------------------------


def peak_one(shape: dict, *, batch: int, seq: int, scored: int) -> dict:
    """Peak RSS of one forward/backward (token log-probs summed) of a bf16 LoRA model, over
    the process's RSS just before: without, then with activation checkpointing, the peak
    started over in between. Run with MALLOC_MMAP_THRESHOLD_ fixed so that large tensors
    are mapped and unmapped (the RSS follows what is alive)."""
    import torch
    from transformers import Qwen2ForCausalLM

    from training.trainer.logprobs import token_logprobs

    torch.set_num_threads(1)
    torch.manual_seed(0)
    policy, _ = product_policy(Qwen2ForCausalLM(qwen2_config(shape)), device="cpu")
    net = policy.model

    def step(rows: int) -> None:
        ids = torch.randint(0, shape["vocab"], (rows, seq))
        attention = torch.ones_like(ids)
        attention[0, :4] = 0
        token_logprobs(net, ids, attention, keep=scored).sum().backward()
        net.zero_grad(set_to_none=True)

    out = {}
    for mode in ("no checkpointing", "checkpointing"):
        if mode == "checkpointing":
            net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        step(1)  # first-call allocations, at a batch too small to set the peak
        reset = reset_peak_rss()
        before, peak_before = memory_status()
        step(batch)
        _, peak = memory_status()
        out[mode] = {"measured": peak - before, "valid": reset and peak > peak_before}
    return out


def memory_status() -> tuple[int, int]:
    """(RSS, peak RSS) of this process in bytes (Linux: VmRSS, VmHWM)."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def reset_peak_rss() -> bool:
    """Start the peak RSS over from the current RSS (Linux ≥ 4.0); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def measure_peak(shape: dict, *, batch: int, seq: int, scored: int) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    spec = json.dumps({"shape": shape, "batch": batch, "seq": seq, "scored": scored})
    out = subprocess.run(
        [sys.executable, __file__, "--peak-one", spec], check=True, capture_output=True, text=True, env=env
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


# --- ESTIMATED: per GPU ------------------------------------------------------------------------


def static_per_gpu(c: Counts, gpus: int) -> dict:
    """Bytes per GPU besides the activations.

    1 GPU (or replicated processes): the whole bf16 base and the adapter's weights,
    gradients and AdamW moments (4 + 4 + 8 bytes per parameter at fp32).
    FSDP2 over N: all of that /N, plus what is unsharded in flight: the root unit
    (embeddings, final norm, output layer) stays gathered for the whole step (FSDP2 does not
    reshard the root after the forward pass), and two decoder layers (the one running and
    the one prefetched). FSDP2 also copies each all-gather's output into the layer's
    parameters, a third layer-sized buffer for a moment, left to the headroom."""
    lora_states = c.lora * (c.lora_bytes_each + c.lora_bytes_each + 8)
    base_each = c.base_bytes // c.params
    if gpus == 1:
        return {"base": c.base_bytes, "lora": lora_states, "in_flight": 0}
    block = c.block_params * base_each + c.block_lora * c.lora_bytes_each
    return {
        "base": c.base_bytes / gpus,
        "lora": lora_states / gpus,
        "in_flight": c.root_params * base_each + 2 * block,
    }


def largest_micro_batch(budget: float, static: float, per_sequence: float) -> int:
    return max(0, math.floor((budget - static) / per_sequence))


def forward_flops_per_token(shape: dict, c: Counts, seq: int, scored: int) -> float:
    """2 FLOPs per multiply-add: every decoder-layer weight, the output layer on the scored
    share of the positions, and the attention (q·k and the weighted sum of v: 2 x 2·h·seq,
    halved by the causal mask)."""
    block = shape["layers"] * c.block_params
    output = shape["vocab"] * shape["hidden"] * scored / seq
    return 2 * (block + output) + 2 * shape["layers"] * shape["hidden"] * seq


JOBS = {
    "grpo": "GRPO micro_batch",  # logits on the response only
    "sft": "SFT sequences/process",  # logits on every position but the first
}


def scored_positions(job: str, args: argparse.Namespace) -> int:
    return args.response if job == "grpo" else args.seq - 1


def recipe(name: str, shape: dict, c: Counts, args: argparse.Namespace) -> dict:
    budgets = {card: mib * 2**20 * (1 - args.headroom) for card, mib in CARDS_MIB.items()}
    act = {
        (job, ck): peak_per_sequence(shape, c.lora_rank, args.seq, scored_positions(job, args), checkpointing=ck)
        for job in JOBS
        for ck in (False, True)
    }
    rows = []
    for gpus in (1, 2, 4, 8):
        parts = static_per_gpu(c, gpus)
        static = sum(parts.values())
        row = {"gpus": gpus, **{k: v / GIB for k, v in parts.items()}, "static": static / GIB}
        kv = kv_cache_per_token(shape) * args.seq * math.ceil(ROLLOUT_SEQUENCES / gpus)
        row["sampler"] = (static + kv) / GIB
        for (job, ck), per_sequence in act.items():
            for card, budget in budgets.items():
                row[fit_key(job, card, ck)] = largest_micro_batch(budget, static, per_sequence)
        rows.append(row)
    flops = {job: forward_flops_per_token(shape, c, args.seq, scored_positions(job, args)) for job in JOBS}
    rate = args.mfu * PEAK_TFLOPS * 1e12
    return {
        "model": name,
        "counts": asdict(c),
        "activation_per_sequence_gib": {f"{job}{' ckpt' if ck else ''}": v / GIB for (job, ck), v in act.items()},
        "kv_cache_per_token": kv_cache_per_token(shape),
        "per_gpu": rows,
        "forward_flops_per_token": flops,
        # A LoRA update: the forward pass and the backward pass to the activations (the
        # frozen weights get no gradient), about two forward passes. A GRPO step with beta > 0
        # or a KL budget adds the reference pass: three (at beta = 0 it runs only at the
        # evaluations, GRPOConfig.reference_due: this is the slower case).
        "sft_tokens_per_s_per_gpu": rate / (2 * flops["sft"]),
        "grpo_tokens_per_s_per_gpu": rate / (3 * flops["grpo"]),
    }


def fit_key(job: str, card: str, checkpointing: bool) -> str:
    return f"fit {job} {card}{' ckpt' if checkpointing else ''}"


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
