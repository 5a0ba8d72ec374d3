"""Rollouts from a vLLM engine the job starts for itself (`"rollout": "colocate"`): one GPU
does both sampling and training, with no inference server to run beside the job.

The engine is vLLM's offline `LLM` over the job's base model, started when the job starts
(its engine core runs in a child process of the trainer, on the same device) and shut down
when the job ends. Everything else is `VllmRollouts`': each step the current adapter is
saved and loaded into the engine under a fresh name (the previous one removed), the
step's prompts are sampled under it with the job's sampling settings, per-item seeds and
`structured_outputs`, the trainer trains on exactly the ids sampled, and each token's
policy term is weighed by the sampling correction against the engine's log-probs
(`logprobs_mode="processed_logprobs"`, as the server runs).

On a GPU the engine sleeps while the trainer trains (vLLM's sleep mode, level 1: its
weights go to the CPU's memory and its KV cache is freed) and wakes before it samples, so
the two do not hold the device's memory at once; `colocate_memory` is the share of the
device the engine may take when awake, and the trainer's peak plus that share must fit the
device. (Not run on a GPU here: no GPU was available.) On a CPU there is no sleep mode: the
engine's KV cache (`VLLM_CPU_KVCACHE_SPACE`, 1 GiB unless set) stays allocated.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from training.trainer.parallel import Ranks
from training.trainer.vllm_rollout import VllmError, VllmRollouts

# vLLM's LoRA slots come in these ranks; an adapter of rank r needs a slot ≥ r.
_LORA_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
# The sampling settings a request does not set itself, which the model's generation config
# may give (the job sets temperature, top_p and the length).
_DEFAULTED = ("top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")

logger = logging.getLogger(__name__)


class ColocatedRollouts(VllmRollouts):
    def __init__(self, *, config, run_dir: Path, lora_rank: int):
        """Start the job's engine, with LoRA slots for the trained adapter's `lora_rank`
        (`adapter_rank`: a job continued from a LoRA version trains that version's rank,
        whatever `config.lora_rank` says)."""
        self.run_dir = run_dir
        self.name_prefix = ""  # the engine is the job's own: no other job's names to avoid
        self.loaded: str | None = None
        self.base_model = None

        self.ranks = Ranks()  # one process (the config refuses more)
        self.cuda = pick_cuda(config)
        self.processes: list = []
        before = set(multiprocessing.active_children())
        self.engine = colocated_engine(config, cuda=self.cuda, lora_rank=lora_rank)
        self.processes = [p for p in multiprocessing.active_children() if p not in before]
        # The model's generation_config sampling defaults (top_k, min_p, penalties), which a
        # server applies to every field a request leaves out: the engine must sample as the
        # server would, and `SamplingParams` given explicitly skips them.
        self.defaults = {
            key: value
            for key, value in self.engine.llm_engine.model_config.get_diff_sampling_param().items()
            if key in _DEFAULTED
        }
        self.requests: dict[str, Any] = {}
        self.next_id = 1
        self.asleep = False

    def _serve(self, policy, name: str, weights: dict[str, torch.Tensor] | None) -> None:
        """Load the adapter into the engine as `name`, then remove the one loaded before."""
        from vllm.lora.request import LoRARequest

        self.wake()
        folder = self.run_dir / "rollout-adapters" / name
        shutil.rmtree(folder, ignore_errors=True)
        policy.save_pretrained(folder, state_dict=weights)
        request = LoRARequest(name, self.next_id, str(folder))
        self.next_id += 1
        try:
            self.engine.llm_engine.add_lora(request)
        except Exception as exc:  # the engine's own errors: the adapter's shape, its rank
            raise VllmError(f"the colocated engine could not load the adapter: {exc}") from exc
        self.requests[name] = request
        if self.loaded:
            old = self.requests.pop(self.loaded)
            self.engine.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(self.run_dir / "rollout-adapters" / self.loaded, ignore_errors=True)

    def _choices(self, prompts: list[list[int]], fields: list[dict], *, config) -> list[list[dict]]:
        """Every prompt in one batched `generate` under the adapter loaded last, each under
        its sampling `fields` and the model's generation defaults, each prompt's choices in
        the `/completions` form the server answers with."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        structured = None
        if getattr(config, "structured_outputs", None):
            from vllm.sampling_params import StructuredOutputsParams

            structured = StructuredOutputsParams(**config.structured_outputs)
        params = [SamplingParams(**self.defaults, **f, logprobs=0, structured_outputs=structured) for f in fields]
        self.wake()
        try:
            outputs = self.engine.generate(
                [TokensPrompt(prompt_token_ids=list(p)) for p in prompts],
                params,
                lora_request=self.requests[self._adapter()],
                use_tqdm=False,
            )
        except Exception:
            self.asleep = False  # a dead engine is not put to sleep: its own error is the job's
            raise
        self.sleep()
        return [[_choice(i, c) for i, c in enumerate(out.outputs)] for out in outputs]

    def wake(self) -> None:
        """Before the engine loads or samples: on a GPU, the trainer's cached blocks go back
        to the device first (the engine's core is another process and cannot use them), then
        the engine takes its weights and KV cache back."""
        if self.asleep:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            self.engine.wake_up()
            self.asleep = False

    def sleep(self) -> None:
        """On a GPU, free the device for training until the next sample (level 1: the
        weights wait in the CPU's memory, the KV cache is dropped)."""
        if self.cuda and not self.asleep:
            self.engine.sleep(level=1)
            self.asleep = True

    def close(self) -> None:
        """Shut the engine down (its core process ends and its memory is freed). Called as
        the job ends, maybe with its error on the way: a failure here is logged, not raised
        over that error."""
        engine, self.engine = self.engine, None
        try:
            if engine is not None:
                engine.llm_engine.engine_core.shutdown()
        except Exception:
            logger.exception("the colocated vLLM engine did not shut down cleanly")
        # The shutdown kills a core that outlives its grace period without waiting for it:
        # on a loaded machine the process is still exiting (its memory being freed) when the
        # job ends. Waited for and reaped here, so the job ends with the engine gone.
        for process in self.processes:
            process.join(timeout=60)
            if process.is_alive():
                logger.error("the colocated vLLM engine's process %s is still running after its shutdown", process.pid)
        self.processes = []
        shutil.rmtree(self.run_dir / "rollout-adapters", ignore_errors=True)


def _choice(index: int, completion) -> dict:
    """One of the engine's completions as a `/completions` choice: the sampled ids and the
    log-prob of each (with `logprobs=0` each position holds the sampled token's)."""
    ids = list(completion.token_ids)
    values = [
        None if top is None or token not in top else top[token].logprob
        for token, top in zip(ids, completion.logprobs or [], strict=False)
    ]
    return {
        "index": index,
        "token_ids": ids,
        "logprobs": {"token_logprobs": values},
        "text": completion.text,
        "finish_reason": completion.finish_reason,
    }


def pick_cuda(config) -> bool:
    return config.device != "cpu" and torch.cuda.is_available()


def lora_slot(rank: int) -> int:
    """The smallest LoRA slot rank vLLM offers that holds an adapter of `rank`."""
    for slot in _LORA_SLOTS:
        if slot >= rank:
            return slot
    raise VllmError(f"lora_rank {rank} is larger than vLLM's largest LoRA slot ({_LORA_SLOTS[-1]})")


def adapter_rank(policy) -> int:
    """The rank the trained LoRA adapter has (its largest, with a per-module pattern)."""
    config = policy.model.peft_config[policy.model.active_adapter]
    return max([int(config.r), *(int(r) for r in (config.rank_pattern or {}).values())])


def colocated_engine(config, *, cuda: bool, lora_rank: int):
    """vLLM's `LLM` over the job's base model with LoRA slots of `lora_rank`, started on
    this process's device: on a GPU `colocate_memory` of it and sleep mode, on a CPU eager
    mode in float32 (as `ServerSpec` serves there)."""
    from transformers import AutoConfig

    # The engine core is its own process: spawned, not forked from a trainer that holds
    # threads (and, in a torchrun process, a process group).
    os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    try:
        from vllm import LLM
    except ImportError as exc:
        raise VllmError(f"rollout 'colocate' needs vLLM on the worker: {exc}") from exc

    longest = int(getattr(AutoConfig.from_pretrained(config.model_path), "max_position_embeddings", 4096) or 4096)
    options: dict[str, Any] = {
        "model": config.model_path,
        "enable_lora": True,
        "max_lora_rank": lora_slot(lora_rank),
        "max_loras": 1,
        "max_model_len": min(longest, config.colocate_max_model_len),
        "seed": config.seed,
        "logprobs_mode": "processed_logprobs",
    }
    if cuda:
        dtype = "bfloat16" if config.dtype == "bfloat16" else "float32"
        options |= {"dtype": dtype, "gpu_memory_utilization": config.colocate_memory, "enable_sleep_mode": True}
    else:
        options |= {"dtype": "float32", "enforce_eager": True}
    try:
        return LLM(**options)
    except Exception as exc:  # the engine's start fails the job with its reason
        raise VllmError(f"the colocated vLLM engine did not start: {type(exc).__name__}: {exc}") from exc
