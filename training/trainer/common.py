"""What the kinds' steps share: callbacks to the caller, batch selection that survives a
resume, seeded evaluation, group advantages, rollout statistics, micro-batches."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, pstdev
from typing import Any

import torch

from training.trainer import loss as L
from training.trainer import monitors
from training.trainer.config import GRPOConfig, TrainConfig
from training.trainer.items import Scorer, TurnItem
from training.trainer.parallel import SeenRollout
from training.trainer.sampling import Rollout, encode_prompt, sample
from training.trainer.sharding import lockstep


@dataclass
class Hooks:
    """How a loop reports to its caller (a Celery task, a script). All optional.

    - on_step(step, metrics): after every optimiser step.
    - on_eval(step, metrics): after each evaluation (step 0 = the starting model).
    - on_samples(step, rows): sample rollouts with their rewards, every `samples_every`.
    - on_checkpoint(step, path): after a checkpoint is written.
    - on_breach(step, breaches): when a reward-hacking monitor fires.
    - should_stop() -> bool: polled before each step; True checkpoints and stops.
    - log(message): human-readable progress lines.
    - on_episodes(step, phase, episodes): every environment episode of a step ("train")
      or an evaluation ("eval"), for recording them as traces.
    - on_phase(name, done, total): what the loop is doing now, with its own progress:
      "evaluation" (items or episodes done of total), "sampling" and "update" (step of
      steps), "export" (0 of 1); the caller adds "loading" and "registration".
    - holds() -> bool: whether this run still holds its job; checked before every
      checkpoint and the export, which write to the job's folder, and False raises
      `WorkLost`. A caller's other hooks raise it too once another worker has the job.
    """

    on_step: Callable[[int, dict], None] | None = None
    on_eval: Callable[[int, dict], None] | None = None
    on_samples: Callable[[int, list[dict]], None] | None = None
    on_checkpoint: Callable[[int, Path], None] | None = None
    on_breach: Callable[[int, list[dict]], None] | None = None
    should_stop: Callable[[], bool] | None = None
    log: Callable[[str], None] | None = None
    on_episodes: Callable[[int, str, list], None] | None = None
    on_phase: Callable[[str, int, int], None] | None = None
    holds: Callable[[], bool] | None = None

    def emit(self, name: str, *args: Any) -> None:
        fn = getattr(self, name)
        if fn is not None:
            fn(*args)

    def stop_requested(self) -> bool:
        return bool(self.should_stop and self.should_stop())

    def check_held(self) -> None:
        if self.holds is not None and not self.holds():
            raise WorkLost("another worker holds this job now (or it was ended): this run writes nothing more")


class WorkLost(RuntimeError):
    """The run no longer holds its job: the stale-work sweep gave it to another worker, or
    ended it. Unlike a cancel, nothing may be written on the way out: no checkpoint, no
    export, no event. The other worker resumes from the last checkpoint in the same folder."""


def batch_for_step(items: list, *, step: int, size: int, seed: int) -> list:
    """The items of step `step` (1-based): epochs of seeded permutations walked in
    order, so a resumed job sees exactly the batches it would have seen."""
    n = len(items)
    if n == 0:
        raise ValueError("no training items")
    out = []
    for k in range((step - 1) * size, step * size):
        epoch, index = divmod(k, n)
        order = list(range(n))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        out.append(items[order[index]])
    return out


class PromptCache:
    """Chat-template encodings, computed once per item."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[tuple[str, str], list[int]] = {}

    def get(self, item: TurnItem, *, variant: str = "", messages: list[dict] | None = None) -> list[int]:
        key = (item.id, variant)
        if key not in self._cache:
            self._cache[key] = encode_prompt(self.tokenizer, messages or item.messages, item.tools)
        return self._cache[key]


def rollout_stats(rollout: Rollout | SeenRollout) -> dict[str, float]:
    """Length, empty, truncated and tool-call figures of a step's samples (a data-parallel
    step passes the global batch's, `parallel.rollout_seen`)."""
    lengths = rollout.lengths.float().tolist()
    texts = rollout.texts
    seen, invalid = monitors.tool_call_validity(texts)
    return {
        "response_length": fmean(lengths),
        "empty_share": fmean(1.0 if not t.strip() else 0.0 for t in texts),
        "truncated_share": fmean(1.0 if t else 0.0 for t in rollout.truncated),
        "tool_calls_seen": seen,
        "tool_calls_invalid": invalid,
    }


def evaluate(
    policy,
    items: list[TurnItem],
    score: Scorer,
    *,
    config: TrainConfig,
    prompts: PromptCache,
    samples: int | None = None,
    batch: int = 16,
    progress: Callable[[int, int], None] | None = None,
    server=None,
) -> dict[str, float]:
    """Mean reward and success rate (reward ≥ 0.5) of fresh samples on `items`.

    Seeded with the job's seed and the global RNG restored afterwards, so evaluating
    does not change the training run, and two evaluations of one model agree.
    `server` (a `VllmRollouts` with the policy's adapter loaded): sample there, the way
    the policy is served (the config's `structured_outputs` included), with vLLM's
    per-request seed; else the local sampler.

    A sharded job's other processes (`sharding.py`) run this beside rank 0 for its forward
    passes only: they sample and do not score (their rewards read 0; rank 0's are the job's)."""
    if not items:
        return {}

    scoring = (ranks := lockstep(policy.model)) is None or ranks.owner
    samples = samples or config.eval_samples
    cpu_state = torch.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    torch.manual_seed(config.seed + 7919)
    rewards: list[float] = []
    lengths: list[float] = []
    try:
        for start in range(0, len(items), max(1, batch // samples)):
            chunk = items[start : start + max(1, batch // samples)]
            chunk_prompts = [prompts.get(it) for it in chunk]
            if server is not None:
                # Prompt k of the whole list: seed + k·samples, so no two samples share a seed.
                seeds = [config.seed + 7919 + (start + k) * samples for k in range(len(chunk))]
                rollout = server.generate(policy, chunk_prompts, config=config, num_samples=samples, seeds=seeds)
            else:
                rollout = sample(
                    policy.model,
                    policy.tokenizer,
                    chunk_prompts,
                    num_samples=samples,
                    max_new_tokens=config.max_new_tokens,
                    temperature=config.temperature,
                    top_p=config.top_p,
                )
            for i, item in enumerate(chunk):
                texts = rollout.texts[i * samples : (i + 1) * samples]
                rewards += score(item, texts) if scoring else [0.0] * len(texts)
            lengths += rollout.lengths.float().tolist()
            if progress is not None:
                progress(min(len(items), start + len(chunk)), len(items))
    finally:
        torch.set_rng_state(cpu_state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
    return {
        "reward": fmean(rewards),
        "success": fmean(1.0 if r >= 0.5 else 0.0 for r in rewards),
        "reward_std": pstdev(rewards) if len(rewards) > 1 else 0.0,
        "response_length": fmean(lengths),
        "n": len(rewards),
    }


def micro_batches(rows: int, size: int) -> list[slice]:
    """The row slices of a batch of `rows`, `size` each (0 = one slice of all)."""
    size = size or rows
    return [slice(start, start + size) for start in range(0, rows, size)]


class TokenMeans:
    """Token means (the KL, the clip fraction, the sampling-correction figures) of a batch
    from its micro-batches' own token means, each weighed by its trained tokens, so a
    micro-batched step logs what a single pass would."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.tokens: dict[str, float] = {}

    def add(self, means: dict[str, float], tokens: float) -> None:
        for name, value in means.items():
            self.sums[name] = self.sums.get(name, 0.0) + value * tokens
            self.tokens[name] = self.tokens.get(name, 0.0) + tokens

    def get(self, name: str) -> float | None:
        if name not in self.sums:
            return None
        return self.sums[name] / self.tokens[name] if self.tokens[name] else 0.0

    def as_dict(self) -> dict[str, float]:
        return {name: self.get(name) for name in self.sums}


def finite_check(value: float, *, what: str, step: int) -> float:
    """Return `value`, or raise FloatingPointError when it is NaN or infinite.

    Called on the loss before `backward()` (or, for micro-batches accumulated by
    `episode_loss_backward`, on their sum) and on the gradient norm before
    `optimizer.step()`: a step on a non-finite loss or gradient writes NaN into every
    trained weight, and the job must stop with its weights as they were (its last
    checkpoint stays good to resume from)."""
    if not math.isfinite(value):
        raise FloatingPointError(f"the {what} became {value} at step {step}, before the weights were stepped")
    return value


def group_advantages_kept(
    rewards: list[float], *, groups: int, config: GRPOConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(advantages (N, G), keep (N,), rows (B',)) of task-major `rewards`, G =
    `config.group_size` per group (`loss.group_advantages`): groups whose rewards are all
    equal carry no signal, and `rows` (indices into the N·G samples) leaves them out
    unless `drop_zero_variance` is off."""
    reward_tensor = torch.tensor(rewards).view(groups, config.group_size)  # (N, G)
    advantages, keep = L.group_advantages(
        reward_tensor, baseline=config.baseline, scale_std=config.scale_std, clip=config.advantage_clip
    )
    row_keep = keep.repeat_interleave(config.group_size)  # (B,)
    if not config.drop_zero_variance:
        row_keep = torch.ones_like(row_keep)
    return advantages, keep, row_keep.nonzero().squeeze(1)


def group_rewards(batch: list[TurnItem], texts: list[str], score: Scorer, *, group_size: int) -> list[float]:
    """Score each item's group of candidates together (a judge compares them side by
    side); task-major, one reward per candidate."""
    rewards: list[float] = []
    for i, item in enumerate(batch):
        group = texts[i * group_size : (i + 1) * group_size]
        scores = score(item, group)
        if len(scores) != len(group):
            raise ValueError(f"the scorer returned {len(scores)} rewards for {len(group)} candidates")
        rewards += [float(s) for s in scores]
    return rewards


def phase_seconds(started: float, sampled: float, scored: float, finished: float) -> dict[str, float]:
    """A group step's wall-clock split, from `time.perf_counter()` readings."""
    return {
        "step_seconds": finished - started,
        "sample_seconds": sampled - started,
        "score_seconds": scored - sampled,
        "update_seconds": finished - scored,
    }
