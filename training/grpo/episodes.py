"""Full-episode GRPO: the orchestrator runs G episodes of each task against the policy
being trained, the grader (optionally with a judge) rewards each whole episode, group
advantages compare the G episodes of a task, and the loss covers the model's own tokens
across all turns of each episode (prompts and tool results masked out).

`episodes_train` reads top to bottom:
rollout (episodes) → reward → advantages → update → log → monitor → evaluate/checkpoint.

Episodes run in parallel threads, one per episode, each in its own sandbox through the
same `episode_run` loop as evaluation and the demo agent; their model turns are batched:
when every running episode waits for the model, one batched sampling call serves them
all. The model is the trainer's policy on the CPU/GPU (`rollout="local"`) or a vLLM
server serving the current adapter (`rollout="vllm"`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean, pstdev
from typing import Any

import torch

from training.environments.base import Environment, Task
from training.environments.episodes import Completion, Episode, episode_run
from training.grpo import loss as L
from training.grpo import monitors
from training.grpo.common import (
    Hooks,
    TokenMeans,
    TrainResult,
    batch_for_step,
    checkpoint_save,
    finite_check,
    micro_batches,
    result_close,
    setup_torch,
    step_close,
)
from training.grpo.config import EpisodesConfig
from training.grpo.episode_tokens import episode_segments, episode_tokens, episode_values
from training.grpo.policy import (
    Policy,
    latest_checkpoint,
    load_checkpoint,
    load_policy,
    make_optimizer,
)
from training.grpo.sampling import common_prefix_length, eos_ids, left_pad, prefix_decode, token_logprobs
from training.inference.codec import tool_calls_parse


@dataclass
class SampledTurn:
    """What the model sampled for one context: the ids (end-of-turn included when
    sampled) and, from a vLLM server, its log-prob of each (the q that
    `loss.sampling_correction` weighs against); None when the trainer's own model sampled."""

    ids: list[int]
    logprobs: list[float] | None = None


# generate(contexts, limits, seeds) -> one SampledTurn per context. seeds: a per-request
# seed for each context (vLLM's), or None; the local sampler draws from the global RNG.
Generate = Callable[[list[list[int]], list[int], list[int | None]], list[SampledTurn]]
# judge(task, episodes) -> one score in [0, 1] per episode
EpisodeJudge = Callable[[Task, list[Episode]], list[float]]


# --- the orchestrator ----------------------------------------------------------------------

_TOKENIZER_LOCK = threading.Lock()


class _Batcher:
    """Collects the model calls of episodes running in threads and serves them in one
    batched `generate` call once every episode still running is waiting for the model.
    Rows go to `generate` ordered by episode, not by arrival, so a seeded run draws the
    same random numbers for the same episodes whatever the threads' timing."""

    def __init__(self, generate: Generate, active: int):
        self.generate = generate
        self.active = active
        self.cv = threading.Condition()
        self.pending: dict[int, tuple[list[int], int, int | None]] = {}
        self.results: dict[int, SampledTurn] = {}
        self.error: BaseException | None = None

    def submit(self, ids: list[int], limit: int, *, key: int, seed: int | None = None) -> SampledTurn:
        """Wait for the model's continuation of `ids`; `key` is the episode's index."""
        with self.cv:
            ticket = key
            self.pending[ticket] = (ids, limit, seed)
            self._run_if_ready()
            while ticket not in self.results and self.error is None:
                self.cv.wait()
            if self.error is not None:
                raise RuntimeError("sampling failed") from self.error
            return self.results.pop(ticket)

    def finished(self) -> None:
        with self.cv:
            self.active -= 1
            self._run_if_ready()

    def _run_if_ready(self) -> None:  # holds the lock
        if not self.pending or len(self.pending) < self.active or self.error is not None:
            return
        batch, self.pending = dict(sorted(self.pending.items())), {}
        try:
            contexts, limits, seeds = (list(column) for column in zip(*batch.values(), strict=True))
            out = self.generate(contexts, limits, seeds)
        except BaseException as exc:  # every waiting episode re-raises it
            self.error = exc
        else:
            self.results.update(zip(batch, out, strict=True))
        self.cv.notify_all()


def local_generate(policy: Policy, config: EpisodesConfig) -> Generate:
    """Sample with the trainer's own model: one batched, KV-cached decode per call, the
    contexts' shared prefix computed once."""
    stop = eos_ids(policy.model, policy.tokenizer)
    pad_id = policy.tokenizer.pad_token_id if policy.tokenizer.pad_token_id is not None else stop[0]

    def generate(contexts: list[list[int]], limits: list[int], seeds: list[int | None]) -> list[SampledTurn]:
        was_training = policy.model.training
        policy.model.eval()
        try:
            sampled = prefix_decode(
                policy.model,
                contexts,
                max_new_tokens=max(1, min(config.max_new_tokens, max(limits))),
                temperature=config.temperature,
                top_p=config.top_p,
                eos_ids=stop,
                pad_id=pad_id,
            )
        finally:
            if was_training:
                policy.model.train()
        ends = set(stop)
        rows: list[SampledTurn] = []
        for tokens, limit in zip(sampled.tolist(), limits, strict=True):
            # Up to and including the first end token; the padding after it is not the model's.
            end = next((i for i, token in enumerate(tokens) if token in ends), len(tokens) - 1)
            rows.append(SampledTurn(tokens[: min(end + 1, max(1, min(limit, config.max_new_tokens)))]))
        return rows

    return generate


def policy_completer(
    tokenizer,
    batcher: _Batcher,
    stop_ids: set[int],
    *,
    context_messages: int = 0,
    key: int = 0,
    seed: int | None = None,
) -> Callable[..., Completion]:
    """A `complete(messages, tools, max_tokens)` for one episode: it keeps the ids the
    model sampled, builds the next context from them (`episode_segments`), and parses the
    sampled text into an OpenAI-format message (`<tool_call>` blocks → `tool_calls`).
    `seed`: turn j of the episode is requested with seed + j. The completion's `extra`
    carries the ids, the text and, from a server, its log-prob of each id."""
    sampled: list[list[int]] = []

    def complete(messages: list[dict[str, Any]], tools: list[dict[str, Any]], max_tokens: int) -> Completion:
        with _TOKENIZER_LOCK:  # a fast tokenizer may refuse concurrent calls ("Already borrowed")
            segments = episode_segments(
                tokenizer, messages, tools, sampled, generation=True, context_messages=context_messages
            )
        context, _ = episode_tokens(segments)
        turn = batcher.submit(context, max_tokens, key=key, seed=None if seed is None else seed + len(sampled))
        ids = turn.ids
        sampled.append(ids)
        with _TOKENIZER_LOCK:
            text = tokenizer.decode(ids, skip_special_tokens=True)
        content, calls = tool_calls_parse(text)
        message: dict[str, Any] = {"content": content}
        if calls:
            message["tool_calls"] = calls
        ended = bool(ids) and ids[-1] in stop_ids
        extra: dict[str, Any] = {"ids": ids, "text": text}
        if turn.logprobs is not None:
            extra["logprobs"] = turn.logprobs
        return Completion(
            message=message,
            tokens=len(ids),
            finish_reason=("tool_calls" if calls else "stop") if ended else "length",
            extra=extra,
        )

    return complete


def episodes_rollout(
    env: Environment,
    tasks: Sequence[Task],
    *,
    group_size: int,
    tokenizer,
    generate: Generate,
    stop_ids: set[int],
    max_steps: int | None = None,
    max_tokens: int | None = None,
    seed: int | None = None,
    first_episode: int = 0,
) -> list[Episode]:
    """Run `group_size` episodes of each task, all at once, each in its own state.
    Returns them task-major (episode n·G + g is sample g of task n).

    `seed` seeds each model request (vLLM's per-request seed): episode k of the call,
    numbered from `first_episode`, sends its turn j with seed + k·S + j, S the step budget
    (no episode has more turns), so every request of a seeded run has its own seed and a
    rerun repeats them whatever the threads' timing."""
    jobs = [task for task in tasks for _ in range(group_size)]
    stride = max_steps or env.max_steps
    batcher = _Batcher(generate, active=len(jobs))
    results: list[Episode | None] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(index: int, task: Task) -> None:
        try:
            complete = policy_completer(
                tokenizer,
                batcher,
                stop_ids,
                context_messages=len(task.first_messages()),
                key=index,
                seed=None if seed is None else seed + (first_episode + index) * stride,
            )
            results[index] = episode_run(env, task, complete, max_steps=max_steps, max_tokens=max_tokens)
        except BaseException as exc:
            errors.append(exc)
        finally:
            batcher.finished()

    threads = [threading.Thread(target=run, args=(i, t), daemon=True) for i, t in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [e for e in results if e is not None]


# --- rewards and statistics ----------------------------------------------------------------


def episode_rewards(
    episodes: list[Episode], *, judge_scores: list[float] | None, grader_weight: float, judge_weight: float
) -> list[float]:
    """r = (w_g · grade + w_j · judge) / (w_g + w_j), per episode; the grade alone when
    there are no judge scores or w_j = 0."""
    grades = [e.grade.reward for e in episodes]
    if not judge_scores or judge_weight <= 0:
        return grades
    total = grader_weight + judge_weight
    return [(grader_weight * g + judge_weight * j) / total for g, j in zip(grades, judge_scores, strict=True)]


def episode_stats(episodes: list[Episode]) -> dict[str, float]:
    """Per-step environment-fidelity figures, each a mean over episodes:

    - tool_error_rate: tool errors / tool calls of the episode (0 without calls);
    - budget_exhaustion: the step or token budget ended the episode;
    - early_stop: the episode ended on an answer without a single successful tool call;
    - episode_tokens, turns: the model's tokens and turns per episode;
    plus the turn-level monitors' inputs over all model turns (length, empty, truncated,
    tool-call blocks that did not parse)."""
    texts = [c.extra.get("text", "") for e in episodes for c in e.completions]
    seen, invalid = monitors.tool_call_validity(texts)
    turns = [c for e in episodes for c in e.completions]
    return {
        "tool_error_rate": fmean(e.tool_errors / e.tool_calls if e.tool_calls else 0.0 for e in episodes),
        "budget_exhaustion": fmean(1.0 if e.budget_exhausted else 0.0 for e in episodes),
        "early_stop": fmean(1.0 if e.end == "answered" and e.tool_calls == e.tool_errors else 0.0 for e in episodes),
        "episode_tokens": fmean(e.tokens for e in episodes),
        "turns": fmean(len(e.completions) for e in episodes),
        "response_length": fmean(c.tokens for c in turns) if turns else 0.0,
        "empty_share": fmean(1.0 if not (c.extra.get("text") or "").strip() else 0.0 for c in turns) if turns else 0.0,
        "truncated_share": fmean(1.0 if c.finish_reason == "length" else 0.0 for c in turns) if turns else 0.0,
        "tool_calls_seen": seen,
        "tool_calls_invalid": invalid,
    }


def success_of(reward: float) -> float:
    return 1.0 if reward >= 1.0 - 1e-9 else 0.0


# --- the update ---------------------------------------------------------------------------


@dataclass
class EpisodeBatch:
    input_ids: torch.Tensor  # (B, L) left-padded
    attention_mask: torch.Tensor  # (B, L)
    mask: torch.Tensor  # (B, L - 1) 1 on the model's sampled tokens (as targets)
    rows: list[int] = field(default_factory=list)  # which episodes, in order
    sequences: list[list[int]] = field(default_factory=list)  # unpadded ids per row
    masks: list[list[int]] = field(default_factory=list)  # unpadded 0/1 per token per row
    pad_id: int = 0
    # Unpadded per token per row: the server's log-prob of each sampled token (0 on
    # context); None when the episodes were sampled by the trainer's own model.
    sampler_logprobs: list[list[float]] | None = None


def episode_batch(tokenizer, episodes: list[Episode], rows: list[int], pad_id: int) -> EpisodeBatch:
    """Token layout of the chosen episodes: every sequence is the context/sampled
    concatenation of `episode_tokens`; the mask is shifted by one so that mask[:, t]
    marks the target token t + 1 (what `token_logprobs(keep=L-1)` scores). When every
    turn carries the server's log-probs, they are laid out the same way, per token."""
    seqs, masks, sampler = [], [], []
    served = all("logprobs" in c.extra for r in rows for c in episodes[r].completions)
    for r in rows:
        e = episodes[r]
        sampled = [c.extra["ids"] for c in e.completions]
        opening = len(e.task.first_messages())
        segments = episode_segments(tokenizer, e.messages, e.task.tools, sampled, context_messages=opening)
        ids, mask = episode_tokens(segments)
        seqs.append(ids)
        masks.append(mask)
        if served:
            sampler.append(episode_values(segments, [c.extra["logprobs"] for c in e.completions]))
    input_ids, attention = left_pad(seqs, pad_id)
    mask_padded, _ = left_pad(masks, 0)
    return EpisodeBatch(
        input_ids=input_ids,
        attention_mask=attention,
        mask=mask_padded[:, 1:],
        rows=list(rows),
        sequences=seqs,
        masks=masks,
        pad_id=pad_id,
        sampler_logprobs=sampler if served else None,
    )


def shared_prefix_length(sequences: list[list[int]], masks: list[list[int]], *, share_prefix: bool) -> int:
    """How many leading tokens `sequence_logprobs` computes once for all rows: their
    common prefix before the first sampled target, or 0 (one full pass per row) when not
    sharing or when it is too short to be worth a separate pass."""
    shared = common_prefix_length(sequences) if share_prefix and len(sequences) > 1 else 0
    first_target = min(m.index(1) if 1 in m else len(m) for m in masks)
    shared = min(shared, first_target - 1, min(len(s) for s in sequences) - 2)
    return shared if shared >= 8 else 0


def target_values(rows: list[list[float]], shared: int) -> torch.Tensor:
    """Per-token values of the rows (one per token, like the masks) laid out as
    `sequence_logprobs` lays out its targets for a shared prefix of `shared` tokens:
    (b, T), left-padded with 0, value t of a row belonging to the target at t + 1."""
    tails = [row[shared:] for row in rows]
    width = max(len(t) for t in tails)
    out = torch.zeros((len(tails), width), dtype=torch.float32)
    for b, tail in enumerate(tails):
        if tail:
            out[b, width - len(tail) :] = torch.tensor(tail, dtype=torch.float32)
    return out[:, 1:]


def sequence_logprobs(
    model,
    sequences: list[list[int]],
    masks: list[list[int]],
    *,
    pad_id: int,
    temperature: float,
    share_prefix: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs (b, T), mask (b, T)) of every target token of `sequences`, with the
    gradient when enabled; mask[b, t] = 1 where the target is a token the model sampled.

    With `share_prefix`, the tokens all sequences share before the first sampled token
    (the system prompt, tools and worked example of a job) go through the model once,
    batch 1, and their key/value cache is repeated for the rows; gradients flow back
    through the repeat, so the result (values and gradients) equals one forward pass per
    full row, at a fraction of the cost when the shared part is most of each row."""
    device = next(model.parameters()).device
    shared = shared_prefix_length(sequences, masks, share_prefix=share_prefix)
    if shared == 0:
        ids, attn = left_pad(sequences, pad_id)
        mask_padded, _ = left_pad(masks, 0)
        ids, attn = ids.to(device), attn.to(device)
        keep = ids.shape[1] - 1
        logprobs = token_logprobs(model, ids, attn, keep=keep, temperature=temperature)
        return logprobs, mask_padded[:, 1:].to(device).float()
    from transformers import DynamicCache

    from training.grpo.sampling import gather_logprobs, position_ids

    cache = DynamicCache()
    prefix = torch.tensor([sequences[0][:shared]], device=device)
    model(input_ids=prefix, past_key_values=cache, use_cache=True, logits_to_keep=1)
    cache.batch_repeat_interleave(len(sequences))
    suffix_ids, suffix_attn = left_pad([s[shared:] for s in sequences], pad_id)
    suffix_mask, _ = left_pad([m[shared:] for m in masks], 0)
    suffix_ids, suffix_attn = suffix_ids.to(device), suffix_attn.to(device)
    full_attn = torch.cat([torch.ones((len(sequences), shared), dtype=torch.long, device=device), suffix_attn], dim=1)
    out = model(
        input_ids=suffix_ids,
        attention_mask=full_attn,
        position_ids=position_ids(full_attn)[:, shared:],
        past_key_values=cache,
        use_cache=True,
    )
    logits = out.logits[:, :-1, :]  # (b, S - 1, V): suffix position j predicts suffix token j + 1
    if temperature != 1.0:
        logits = logits / temperature
    logprobs = gather_logprobs(logits, suffix_ids[:, 1:])
    return logprobs, suffix_mask[:, 1:].to(device).float()


def episode_loss_backward(
    policy: Policy,
    batch: EpisodeBatch,
    advantages: torch.Tensor,
    *,
    config: EpisodesConfig,
    constant: float,
    micro_batch: int,
    share_prefix: bool = True,
) -> dict:
    """Accumulate the gradient of the episode loss over micro-batches.

    Per token: -A_episode · w · exp(logp - stopgrad(logp)) + β · k3 (`loss.policy_loss`,
    one update per batch so the ratio is 1), summed over the model's tokens of every turn
    and divided by `constant` (the "constant" normaliser: episodes x the episode token
    budget, so the micro-batches add up to the full-batch loss with no length bias).
    w = `loss.sampling_correction` of this pass's log-probs against the server's, for
    episodes a vLLM server sampled (with `config.sampling_correction`), else 1.
    KL(π ‖ π_start) by k3 is logged as a token mean when asked, and the correction's
    figures ("correction": {} without a server) as token means over the batch."""
    device = policy.device
    total_loss = 0.0
    means, correction = TokenMeans(), TokenMeans()
    sampler_rows = batch.sampler_logprobs if config.sampling_correction else None
    for rows in micro_batches(len(batch.sequences), micro_batch):
        seqs, masks = batch.sequences[rows], batch.masks[rows]
        adv = advantages[rows].to(device)
        options = {"pad_id": batch.pad_id, "temperature": config.temperature, "share_prefix": share_prefix}
        logprobs, mask = sequence_logprobs(policy.model, seqs, masks, **options)
        tokens = float(mask.sum())
        ref = weights = None
        if config.beta > 0 or config.log_kl:
            with torch.no_grad(), policy.as_reference() as reference:
                ref, _ = sequence_logprobs(reference, seqs, masks, **options)
        if sampler_rows is not None:
            shared = shared_prefix_length(seqs, masks, share_prefix=share_prefix)
            sampler = target_values(sampler_rows[rows], shared).to(device)  # (b, T), as logprobs
            weights, stats = L.sampling_correction(logprobs, sampler, mask, cap=config.sampling_correction_cap)
            correction.add(stats, tokens)
        loss, stats = L.policy_loss(
            logprobs,
            adv,
            mask,
            ref_logprobs=ref,
            beta=config.beta,
            normaliser="constant",
            constant=constant,
            sampling_weights=weights,
        )
        means.add(stats, tokens)
        loss.backward()
        total_loss += float(loss.detach())
    return {"loss": total_loss, "kl": means.get("kl"), "correction": correction.as_dict()}


# --- the loop -----------------------------------------------------------------------------


def episodes_evaluate(
    env: Environment,
    tasks: list[Task],
    *,
    policy: Policy,
    config: EpisodesConfig,
    generate: Generate,
    stop_ids: set[int],
    progress: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, float], list[Episode]]:
    """Held-out success: `eval_samples` episodes per task, seeded (the global RNG for the
    local sampler, restored afterwards so evaluating does not change the training run; a
    per-request seed for a server's, so two evaluations of one model agree)."""
    cpu_state = torch.get_rng_state()
    torch.manual_seed(config.seed + 7919)
    try:
        episodes: list[Episode] = []
        per_call = max(1, config.eval_batch // max(1, config.eval_samples))
        for start in range(0, len(tasks), per_call):
            episodes += episodes_rollout(
                env,
                tasks[start : start + per_call],
                group_size=config.eval_samples,
                tokenizer=policy.tokenizer,
                generate=generate,
                stop_ids=stop_ids,
                max_steps=config.max_steps or None,
                max_tokens=config.max_episode_tokens or None,
                seed=config.seed + 7919,
                first_episode=len(episodes),
            )
            if progress is not None:
                progress(len(episodes), len(tasks) * config.eval_samples)
    finally:
        torch.set_rng_state(cpu_state)
    rewards = [e.reward for e in episodes]
    stats = episode_stats(episodes)
    metrics = {
        "reward": fmean(rewards),
        "success": fmean(success_of(r) for r in rewards),
        "n": len(rewards),
        "tool_error_rate": stats["tool_error_rate"],
        "budget_exhaustion": stats["budget_exhaustion"],
        "early_stop": stats["early_stop"],
        "episode_tokens": stats["episode_tokens"],
        "collateral_rate": fmean(1.0 if e.audit.collateral_changes else 0.0 for e in episodes),
        "unknown_id_rate": fmean(1.0 if e.audit.unknown_ids else 0.0 for e in episodes),
    }
    return metrics, episodes


def episodes_train(
    *,
    config: EpisodesConfig,
    env: Environment,
    tasks: list[Task],
    run_dir: Path,
    eval_tasks: list[Task] | None = None,
    judge: EpisodeJudge | None = None,
    hooks: Hooks | None = None,
    policy: Policy | None = None,
    export: bool = True,
    vllm_api_key: str = "",
) -> TrainResult:
    """Train for `config.steps` steps on `tasks` of `env`, resuming from `run_dir`'s latest
    checkpoint if there is one. `hooks.on_episodes(step, phase, episodes)` receives every
    episode (phase "train" or "eval") so the caller can record them as traces.
    `vllm_api_key`: the inference server's key, for `rollout="vllm"`."""
    hooks = hooks or Hooks()
    if not tasks:
        raise ValueError("no training tasks")
    setup_torch(config)
    policy = policy or load_policy(config, reference=config.beta > 0 or config.log_kl)
    optimizer = make_optimizer(policy, config)
    stop_ids = set(eos_ids(policy.model, policy.tokenizer))
    pad_id = policy.tokenizer.pad_token_id
    if config.rollout == "vllm":
        import uuid

        from training.grpo.vllm_rollout import VllmRollouts

        # Unique per run: another job (or this one, resumed) may share the server.
        prefix = f"{run_dir.name}-{uuid.uuid4().hex[:6]}-"
        server = VllmRollouts(base_url=config.vllm_url, run_dir=run_dir, name_prefix=prefix, api_key=vllm_api_key)
        generate = vllm_generate(server, policy, config)
    else:
        server = None
        generate = local_generate(policy, config)

    result = TrainResult(status="finished", step=0)
    state: dict = {"history": [], "evals": [], "start_length": None, "start_canary": None, "breaches": []}
    checkpoint = latest_checkpoint(run_dir)

    def evaluate_now(step: int) -> bool:
        if not eval_tasks:
            return False
        if server is not None:
            server.load(policy, step=f"eval-{step}")
        hooks.emit("on_phase", "evaluation", 0, len(eval_tasks) * config.eval_samples)
        metrics, episodes = episodes_evaluate(
            env,
            eval_tasks,
            policy=policy,
            config=config,
            generate=generate,
            stop_ids=stop_ids,
            progress=lambda done, total: hooks.emit("on_phase", "evaluation", done, total),
        )
        metrics["step"] = step
        state["evals"].append(metrics)
        hooks.emit("on_episodes", step, "eval", episodes)
        hooks.emit("on_eval", step, metrics)
        return True

    if checkpoint is not None:
        saved = load_checkpoint(checkpoint, policy=policy, optimizer=optimizer)
        result.step = saved["step"]
        state = saved["state"]
        hooks.emit("log", f"resumed from {checkpoint.name}")
    else:
        evaluate_now(0)

    budget = config.max_episode_tokens or env.max_tokens
    constant = config.prompts_per_step * config.group_size * budget
    for step in range(result.step + 1, config.steps + 1):
        if hooks.stop_requested():
            checkpoint_save(run_dir, policy, optimizer, step - 1, config, state, hooks)
            result.status = "cancelled"
            break
        started = time.perf_counter()
        hooks.emit("on_phase", "sampling", step, config.steps)
        batch_tasks = batch_for_step(tasks, step=step, size=config.prompts_per_step, seed=config.seed)

        # Rollout: G episodes per task, each in its own sandbox.
        if server is not None:
            server.load(policy, step=str(step))
        episodes = episodes_rollout(
            env,
            batch_tasks,
            group_size=config.group_size,
            tokenizer=policy.tokenizer,
            generate=generate,
            stop_ids=stop_ids,
            max_steps=config.max_steps or None,
            max_tokens=config.max_episode_tokens or None,
        )
        sampled = time.perf_counter()

        # Reward: the grader's, optionally combined with a judge's score of each episode.
        judge_scores: list[float] | None = None
        if judge is not None and config.judge_weight > 0:
            judge_scores = []
            for n, task in enumerate(batch_tasks):
                group = episodes[n * config.group_size : (n + 1) * config.group_size]
                judge_scores += [float(s) for s in judge(task, group)]
        rewards = episode_rewards(
            episodes, judge_scores=judge_scores, grader_weight=config.grader_weight, judge_weight=config.judge_weight
        )
        reward_tensor = torch.tensor(rewards).view(len(batch_tasks), config.group_size)  # (N, G)
        scored = time.perf_counter()

        # Advantages over the G episodes of each task; equal groups carry no signal.
        advantages, keep = L.group_advantages(
            reward_tensor, baseline=config.baseline, scale_std=config.scale_std, clip=config.advantage_clip
        )
        row_keep = keep.repeat_interleave(config.group_size)  # (B,)
        if not config.drop_zero_variance:
            row_keep = torch.ones_like(row_keep)
        rows = row_keep.nonzero().squeeze(1).tolist()

        # Update on the model's own tokens of every turn.
        hooks.emit("on_phase", "update", step, config.steps)
        loss_value = grad_norm = 0.0
        kl_value = None
        correction: dict[str, float] = {}
        if rows:
            batch = episode_batch(policy.tokenizer, episodes, rows, pad_id)
            adv = advantages.view(-1)[rows]  # (B',)
            optimizer.zero_grad(set_to_none=True)
            out = episode_loss_backward(
                policy, batch, adv, config=config, constant=constant, micro_batch=config.micro_batch
            )
            # Micro-batches are summed, so one non-finite loss among them shows here.
            loss_value, kl_value = finite_check(out["loss"], what="loss", step=step), out["kl"]
            correction = out["correction"]
            norm = torch.nn.utils.clip_grad_norm_(policy.trainable_parameters(), config.max_grad_norm)
            grad_norm = finite_check(float(norm), what="gradient norm", step=step)
            optimizer.step()
        finished = time.perf_counter()

        # Log.
        grades = [e.grade.reward for e in episodes]
        metrics = {
            "step": step,
            "reward_mean": fmean(rewards),
            "reward_std": pstdev(rewards),
            "grade_mean": fmean(grades),
            "success": fmean(success_of(g) for g in grades),
            "judge_mean": fmean(judge_scores) if judge_scores else None,
            "zero_variance_share": 1.0 - float(keep.float().mean()),
            "loss": loss_value,
            "kl": kl_value,
            "grad_norm": grad_norm,
            **correction,
            "trained_sequences": len(rows),
            "generated_tokens": sum(e.tokens for e in episodes),
            "step_seconds": finished - started,
            "sample_seconds": sampled - started,
            "score_seconds": scored - sampled,
            "update_seconds": finished - scored,
            **episode_stats(episodes),
        }
        if state["start_length"] is None:
            state["start_length"] = metrics["response_length"]
        state["history"].append(metrics)
        result.step = step
        hooks.emit("on_step", step, metrics)
        hooks.emit("on_episodes", step, "train", episodes)
        if config.samples_every and (step == 1 or step % config.samples_every == 0):
            hooks.emit("on_samples", step, _sample_rows(episodes, rewards, advantages))

        evaluated = bool(config.eval_every and (step % config.eval_every == 0 or step == config.steps))
        if evaluated:
            evaluated = evaluate_now(step)

        # Monitor: the turn-level monitors, the environment-fidelity guard and, on the
        # evaluation episodes, harm to records outside each task.
        breaches = monitors.check(config.monitors, history=state["history"], start_length=state["start_length"])
        breaches += monitors.fidelity(config.monitors, history=state["history"])
        breaches += monitors.harm(config.monitors, evals=state["evals"])
        if step_close(run_dir, policy, optimizer, step, config, state, hooks, breaches):
            result.status = "stopped"
            break

    return result_close(result, state, policy, run_dir, export, hooks)


def _sample_rows(episodes: list[Episode], rewards: list[float], advantages: torch.Tensor) -> list[dict]:
    flat = advantages.view(-1).tolist()
    rows = []
    for k, e in enumerate(episodes):
        transcript = " ⏎ ".join(c.extra.get("text", "") for c in e.completions)
        rows.append(
            {
                "item": e.task.id,
                "prompt": e.task.prompt[:2000],
                "response": transcript[:4000],
                "reward": rewards[k],
                "advantage": round(flat[k], 4),
                "truncated": e.budget_exhausted,
                "reason": e.grade.reason,
            }
        )
    return rows


# --- vLLM -----------------------------------------------------------------------------------


def vllm_generate(server, policy: Policy, config: EpisodesConfig) -> Generate:
    """Sample each context from the vLLM server under the adapter `server.load` made
    current (the contexts go as token ids, so the server reads exactly what training
    will); requests go concurrently and the server batches them. Each turn keeps the
    server's log-prob of every id it sampled, for the sampling correction."""
    from concurrent.futures import ThreadPoolExecutor

    stop = sorted(eos_ids(policy.model, policy.tokenizer))

    def one(context: list[int], limit: int, seed: int | None) -> SampledTurn:
        ids, logprobs = server.complete_ids(
            context,
            max_tokens=max(1, min(limit, config.max_new_tokens)),
            temperature=config.temperature,
            top_p=config.top_p,
            stop_ids=stop,
            seed=seed,
        )
        return SampledTurn(ids, logprobs)

    def generate(contexts: list[list[int]], limits: list[int], seeds: list[int | None]) -> list[SampledTurn]:
        with ThreadPoolExecutor(max_workers=min(16, len(contexts))) as pool:
            return list(pool.map(one, contexts, limits, seeds))

    return generate
