"""Running episodes against the policy: G episodes of each task in parallel threads, one
per episode, each in its own sandbox through the same `episode_run` loop as evaluation
and the demo agent; their model turns are batched: when every running episode waits for
the model, one batched sampling call serves them all. The model is the trainer's policy
on the CPU/GPU (`local_generate`) or a vLLM server serving the current adapter
(`vllm_generate`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from training.environments.base import Environment, Task
from training.environments.episodes import Completion, Episode, episode_run
from training.grpo.config import EpisodesConfig
from training.grpo.episode_tokens import episode_segments, episode_tokens
from training.grpo.policy import Policy
from training.grpo.sampling import eos_ids, prefix_decode
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
