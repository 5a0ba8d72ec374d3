"""The ESTIMATED half of the memory recipe (`memory_recipe.py`): what autograd keeps per
sequence, as a formula of a model's shape (the recipe checks it against the measurements),
and from it and the measured counts what a job needs per GPU, alone or with FSDP2 over N,
the largest micro-batch per card, and the throughput at an assumed utilisation. Plain
arithmetic: no torch.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memory_measured import Counts

GIB = 2**30

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


def head_dim(shape: dict) -> int:
    return shape["hidden"] // shape["heads"]


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
