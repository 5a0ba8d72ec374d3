"""Running episodes against the policy: G episodes of each task at once, each in its own
sandbox through the same loop as evaluation and the demo agent (`episode_steps`, the
generator form of `episode_run`), advanced in step so that one batched sampling call
serves the next turn of every episode still running. The model is the trainer's policy
on the CPU/GPU (`local_generate`) or a vLLM server serving the current adapter
(`vllm_generate`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from training.environments.base import Environment, Task
from training.environments.episodes import Completion, Episode, TurnRequest, episode_steps
from training.inference.codec import tool_calls_parse
from training.trainer.config import EpisodesConfig
from training.trainer.episode_tokens import episode_segments, episode_tokens
from training.trainer.policy import Policy
from training.trainer.sampling import eos_ids, prefix_decode


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


def vllm_generate(server, policy: Policy, config: EpisodesConfig) -> Generate:
    """Sample each context from the vLLM server under the adapter `server.load` made
    current (the contexts go as token ids, so the server reads exactly what training
    will); requests go concurrently and the server batches them. Each turn keeps the
    server's log-prob of every id it sampled, for the sampling correction."""
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


class PolicyTurns:
    """One episode's side of the model: it keeps the ids the model sampled, builds each
    next context from them (`episode_segments`), and parses each sampled turn into an
    OpenAI-format message (`<tool_call>` blocks → `tool_calls`). `seed`: turn j of the
    episode is requested with seed + j. A completion's `extra` carries the ids, the text
    and, from a server, its log-prob of each id."""

    def __init__(self, tokenizer, stop_ids: set[int], *, context_messages: int = 0, seed: int | None = None):
        self.tokenizer = tokenizer
        self.stop_ids = stop_ids
        self.context_messages = context_messages
        self.seed = seed
        self.sampled: list[list[int]] = []

    def context(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> tuple[list[int], int | None]:
        """The ids the model reads next, and the seed of that request."""
        segments = episode_segments(
            self.tokenizer, messages, tools, self.sampled, generation=True, context_messages=self.context_messages
        )
        context, _ = episode_tokens(segments)
        return context, None if self.seed is None else self.seed + len(self.sampled)

    def completion(self, turn: SampledTurn) -> Completion:
        ids = turn.ids
        self.sampled.append(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        content, calls = tool_calls_parse(text)
        message: dict[str, Any] = {"content": content}
        if calls:
            message["tool_calls"] = calls
        ended = bool(ids) and ids[-1] in self.stop_ids
        extra: dict[str, Any] = {"ids": ids, "text": text}
        if turn.logprobs is not None:
            extra["logprobs"] = turn.logprobs
        return Completion(
            message=message,
            tokens=len(ids),
            finish_reason=("tool_calls" if calls else "stop") if ended else "length",
            extra=extra,
        )


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

    The episodes advance in step (`episode_steps`): every episode still running asks for
    its next turn, one `generate` call serves them all, rows ordered by episode, and each
    reads its turn, runs its tool calls and asks again, until all have ended. An error
    stops them all, their states closed.

    `seed` seeds each model request (vLLM's per-request seed): episode k of the call,
    numbered from `first_episode`, sends its turn j with seed + k·S + j, S the step budget
    (no episode has more turns), so every request of a seeded run has its own seed."""
    jobs = [task for task in tasks for _ in range(group_size)]
    stride = max_steps or env.max_steps
    turns = [
        PolicyTurns(
            tokenizer,
            stop_ids,
            context_messages=len(task.first_messages()),
            seed=None if seed is None else seed + (first_episode + k) * stride,
        )
        for k, task in enumerate(jobs)
    ]
    steps = [episode_steps(env, task, max_steps=max_steps, max_tokens=max_tokens) for task in jobs]
    episodes: list[Episode | None] = [None] * len(jobs)
    waiting: dict[int, TurnRequest] = {}

    def advance(k: int, completion: Completion | None) -> None:
        try:
            waiting[k] = steps[k].send(completion)
        except StopIteration as done:
            waiting.pop(k, None)
            episodes[k] = done.value

    try:
        for k in range(len(jobs)):
            advance(k, None)
        while waiting:
            order = sorted(waiting)
            contexts, limits, seeds = [], [], []
            for k in order:
                messages, tools, limit = waiting[k]
                context, request_seed = turns[k].context(messages, tools)
                contexts.append(context)
                limits.append(limit)
                seeds.append(request_seed)
            for k, turn in zip(order, generate(contexts, limits, seeds), strict=True):
                advance(k, turns[k].completion(turn))
    finally:
        _close_all(steps)
    return [e for e in episodes if e is not None]


def _close_all(steps: list) -> None:
    """Close every episode (a no-op for an ended one; it releases the state of one an error
    cut short), each on its own: one sandbox whose teardown fails must not leave the others
    open. The first teardown error is raised once all are closed, unless another error is
    already on its way out (that one is the cause, and stays the one reported)."""
    failure: BaseException | None = None
    for episode in steps:
        try:
            episode.close()
        except Exception as exc:  # every episode is closed before any error is reported
            failure = failure or exc
    if failure is not None and sys.exc_info()[1] is None:
        raise failure
