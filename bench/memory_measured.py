"""The MEASURED half of the memory recipe (`memory_recipe.py`): the models it is about, built
from their public configs and wrapped as a job wraps them, and what the CPU measures of
them: parameter counts on the `meta` device, the tensors autograd saves and the key/value
cache at each model's real shapes, and the peak RSS of a whole forward/backward of a small
model. torch and transformers are imported inside the functions that need them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The recipe's command runs one peak measurement per process (its hidden `--peak-one`).
RECIPE = Path(__file__).with_name("memory_recipe.py")

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
        [sys.executable, str(RECIPE), "--peak-one", spec], check=True, capture_output=True, text=True, env=env
    ).stdout
    return json.loads(out.strip().splitlines()[-1])
