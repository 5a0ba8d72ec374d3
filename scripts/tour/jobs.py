"""The jobs a tour seed trains on its training set: an SFT job, a turn-level GRPO job, or
both in turn (`--method sft+grpo`: GRPO from the SFT adapter), with the settings the tour's
command line gives them.
"""

from __future__ import annotations

import argparse


def job_configs(args: argparse.Namespace, *, seed: int, inference_url: str) -> list[tuple[str, dict]]:
    """(kind, config) of each job to run, in order; GRPO samples its rollouts from the
    server at `inference_url`."""
    from feedback.demo.agent import ACT_OR_REPLY_REGEX

    lora = {
        "adapter": "lora",
        "lora_rank": args.lora_rank,
        "lora_alpha": 2 * args.lora_rank,
        "trainable_layers": args.layers,
        "seed": seed,
        "torch_threads": args.train_threads,
    }
    quiet = {"eval_every": 10, "eval_samples": 2, "checkpoint_every": 0, "samples_every": 0}
    jobs = []
    if args.method in ("sft", "sft+grpo"):
        config = {
            **lora,
            **quiet,
            "learning_rate": args.sft_lr,
            "first_token_weight": args.first_token_weight,
            "steps": args.sft_steps,
            "prompts_per_step": args.sft_prompts,
        }
        jobs.append(("sft", config))
    if args.method in ("grpo", "sft+grpo"):
        config = {
            **lora,
            **quiet,
            "learning_rate": args.lr,
            "steps": args.steps,
            "prompts_per_step": args.prompts,
            "group_size": args.group_size,
            "max_new_tokens": 48,
            # Rollouts on the vLLM server, under the constraint the agent's harness serves with.
            "rollout": "vllm",
            "vllm_url": inference_url.rstrip("/") + "/v1",
            "structured_outputs": {"regex": ACT_OR_REPLY_REGEX},
            "temperature": args.temperature,
            "log_kl": False,
        }
        jobs.append(("grpo", config))
    return jobs
