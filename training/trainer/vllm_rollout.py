"""Rollouts through a vLLM OpenAI-compatible server (the GPU path).

Each step the current LoRA adapter is saved and loaded into the running server at
runtime (`POST /v1/load_lora_adapter`), and the step's prompts are sampled by the
server under that adapter's name; the previous step's adapter is unloaded. The
trainer computes log-probs for the gradient itself, in its own forward pass; the
server's log-probs of the sampled tokens only weigh each token's policy term by how
far the server's distribution (its regex, its numerics) was from the trainer's
(`loss.sampling_correction`).

A data-parallel job's processes (`parallel.py`) share one server: each step rank 0 saves
the adapter (a sharded model's processes first gather it, `sharding.trainable_state`) and
loads it, and every process then samples its own items under that one name. Each item
is sampled with a seed of the job's seed, the step and the item's place in the global
batch, so which process sends it changes nothing.

The transport, its retry rule, the error types and adapter loading are the project's one
inference client (`training.inference.client`); the launcher is `training.inference.server`.
"""

from __future__ import annotations

import logging
import math
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

from training.inference.client import InferenceBadAnswer, InferenceClient, InferenceError
from training.trainer import sharding
from training.trainer.parallel import Ranks
from training.trainer.sampling import Rollout, eos_ids, rollout_from_tokens

logger = logging.getLogger(__name__)

# The rollouts' failures are the inference client's (unavailable, refused, bad answer).
VllmError = InferenceError


class VllmRollouts:
    def __init__(
        self,
        *,
        base_url: str,
        run_dir: Path,
        api_key: str = "",
        timeout: float = 600.0,
        retries: int = 2,
        name_prefix: str | None = None,
        ranks: Ranks | None = None,
    ):
        """`name_prefix` goes before each adapter's name on the server ("step-N"): jobs
        sharing one server (or one job, resumed) need distinct prefixes, or a later job's
        "step-1" is refused; by default it is unique to this instance.
        `api_key` is the server's own key (sent as a Bearer token with every request).
        `ranks`: a data-parallel job's processes, every one of which builds its own
        instance here (a collective: they take rank 0's prefix) and calls `sample` at
        every step."""
        self.ranks = ranks or Ranks()
        if name_prefix is None:
            name_prefix = f"{run_dir.name}-{uuid.uuid4().hex[:6]}-"
        self.name_prefix = self.ranks.gather(name_prefix)[0]
        self.base_url = base_url.rstrip("/")
        self.run_dir = run_dir
        self.server = InferenceClient(base_url, api_key=api_key, timeout=timeout, retries=retries, keep_alive=True)
        self.loaded: str | None = None
        self.base_model: str | None = None

    def _post(self, url: str, payload: dict) -> httpx.Response:
        # A sample is repeatable (another draw from the same policy), so completions are
        # retried like every other call here.
        return self.server.request("POST", url.removeprefix(self.server.url), json=payload)

    def _completions(self, prompt: list[int], fields: dict) -> list[dict]:
        """The choices of one `/completions` request continuing the ids `prompt` under the
        adapter loaded last, each with its sampled ids and their log-probs. `fields`: the
        request's sampling fields (`sampling_fields`, vLLM's names)."""
        payload = {
            "model": self._adapter(),
            "prompt": prompt,
            **fields,
            "return_token_ids": True,
            "logprobs": 0,
        }
        response = self._post(f"{self.base_url}/completions", payload)
        if response.status_code != 200:
            raise VllmError(f"completion failed: {response.status_code} {response.text[:300]}")
        return _choices(response)

    def _adapter(self) -> str:
        if self.loaded is None:
            raise VllmError("no adapter loaded: call load() first")
        return self.loaded

    def _base_model(self) -> str:
        if self.base_model is None:
            self.base_model = self.server.models()[0].id
        return self.base_model

    def load(self, policy, *, step: int | str) -> str:
        """Make the server serve the policy's current adapter; later `complete_ids` and
        `generate` use it. Called by rank 0 alone (an evaluation), except of a sharded
        model, whose processes all call it (their gather of the adapter is a collective)."""
        return self._load_adapter(policy, step, self.ranks if sharding.lockstep(policy.model) else Ranks())

    def complete_ids(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop_ids: list[int],
        seed: int | None = None,
    ) -> tuple[list[int], list[float]]:
        """One sample continuing the token ids `prompt` under the current adapter: (the ids
        sampled, with the end-of-turn id when the server stopped on it; the server's
        log-prob of each, the q of `loss.sampling_correction`). `seed`: vLLM's per-request
        seed, so a seeded request repeats."""
        fields = sampling_fields(
            n=1, max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop_ids=stop_ids, seed=seed
        )
        choice = self._completions(prompt, fields | {"skip_special_tokens": False})[0]
        tokens, logprobs = sampled_tokens(choice)
        if choice.get("finish_reason") == "stop" and (not tokens or tokens[-1] not in stop_ids):
            # A server that leaves the stop id out of token_ids still sampled it, with a
            # probability it did not report: NaN, which the correction reads as unknown.
            tokens.append(stop_ids[0])
            logprobs.append(math.nan)
        return tokens, logprobs

    def _load_adapter(self, policy, step: int | str, ranks: Ranks) -> str:
        """Save the current adapter and make the server serve it under a fresh name.

        With `ranks` of several processes, each of which calls this: a sharded model's
        processes gather the adapter's whole weights, rank 0 saves and loads them, and
        every process then samples under that name, or raises rank 0's error (it is
        broadcast, so no process waits for an adapter that never came)."""
        if policy.adapter != "lora":
            raise VllmError("vLLM rollouts need a LoRA adapter (full fine-tuning reloads weights another way)")
        name = f"{self.name_prefix}step-{step}"
        weights = sharding.trainable_state(policy.model) if sharding.lockstep(policy.model) else None
        failure: Exception | None = None
        if ranks.owner:
            try:
                self._serve(policy, name, weights)
            except Exception as exc:  # the server's refusal, or writing the folder: either way the others must hear
                failure = exc
        message = ranks.gather(f"{type(failure).__name__}: {failure}" if failure else "")[0]
        if failure is not None:
            raise failure
        if message:
            raise VllmError(f"rank 0 could not load the step's adapter: {message}")
        self.loaded = name
        return name

    def _serve(self, policy, name: str, weights: dict[str, torch.Tensor] | None) -> None:
        """Load the adapter as `name` on the server, then unload the one loaded before."""
        folder = self.run_dir / "rollout-adapters" / name
        shutil.rmtree(folder, ignore_errors=True)
        policy.save_pretrained(folder, state_dict=weights)
        # fresh: the folder holds new weights, so a name another run left loaded must not stand in.
        self.server.adapter_load(name, folder, fresh=True, timeout=self.server.timeout)
        if self.loaded:
            self.server.adapter_unload(self.loaded, timeout=self.server.timeout)
            shutil.rmtree(self.run_dir / "rollout-adapters" / self.loaded, ignore_errors=True)

    def sample(
        self,
        policy,
        prompts: list[list[int]],
        *,
        step: int,
        config,
        num_samples: int,
        seeds: list[int] | None = None,
    ) -> ServedRollout:
        """Load the policy's current adapter as "step-N" (every process of the job calls
        this), then `generate` this process's prompts under it."""
        self._load_adapter(policy, step, self.ranks)
        return self.generate(policy, prompts, config=config, num_samples=num_samples, seeds=seeds)

    def generate(
        self, policy, prompts: list[list[int]], *, config, num_samples: int, seeds: list[int] | None = None
    ) -> ServedRollout:
        """`num_samples` samples of each prompt under the adapter loaded last, with the
        config's sampling settings and `structured_outputs`, exactly as the server drew
        them: the sampled ids (never a re-tokenisation of the text, which can differ from
        what was sampled) and the log-prob the server gave each. `seeds` (one per prompt)
        seed the requests: vLLM gives a request's choice i its seed plus i, so a seeded
        call repeats; the caller keeps the seeds `num_samples` apart where no two samples
        may share one.

        The log-probs are what the server reports: with `--logprobs-mode
        processed_logprobs` (our `ServerSpec` starts it so) the distribution it sampled
        from, after the structured-output mask, temperature and top-p, which is the q of
        `loss.sampling_correction`; docs/decisions/0019-sampling-correction.md."""
        self._adapter()
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts")
        stop_ids = eos_ids(policy.model, policy.tokenizer)
        responses: list[list[int]] = []
        logprobs: list[list[float]] = []
        texts: list[str] = []
        fields = [
            sampling_fields(
                n=num_samples,
                max_tokens=config.max_new_tokens,
                temperature=config.temperature,
                top_p=config.top_p,
                stop_ids=stop_ids,
                seed=None if seeds is None else seeds[k],
            )
            for k in range(len(prompts))
        ]
        for choices in self._choices(prompts, fields, config=config):
            for choice in sorted(choices, key=lambda c: c.get("index", 0)):
                tokens, token_logprobs = sampled_tokens(choice)
                responses.append(tokens)
                logprobs.append(token_logprobs)
                texts.append(choice["text"])
        rollout = rollout_from_tokens(
            prompts,
            responses,
            num_samples=num_samples,
            eos_ids=stop_ids,
            pad_id=policy.tokenizer.pad_token_id,
            texts=texts,
            device=policy.device,
        )
        sampler = torch.zeros(rollout.response_mask.shape, dtype=torch.float32)  # (B, T)
        for row, values in enumerate(logprobs):
            sampler[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
        return ServedRollout(**vars(rollout), sampler_logprobs=sampler.to(policy.device))

    def _choices(self, prompts: list[list[int]], fields: list[dict], *, config) -> list[list[dict]]:
        """Each prompt's completion choices (`/completions` answers: index, token_ids,
        logprobs.token_logprobs, text) under its sampling `fields` and the config's
        `structured_outputs`, one request per prompt."""
        structured = getattr(config, "structured_outputs", None)
        extra = {"structured_outputs": structured} if structured else {}
        return [self._completions(prompt, f | extra) for prompt, f in zip(prompts, fields, strict=True)]

    def close(self) -> None:
        """Unload the job's last adapter from the server (rank 0, which loaded it): a
        finished, failed or cancelled job leaves nothing loaded there. A server that does
        not answer keeps it until it restarts; the job's own ending is not changed by that."""
        if not self.ranks.owner or self.loaded is None:
            return
        try:
            self.server.adapter_unload(self.loaded, timeout=min(30.0, self.server.timeout))
        except InferenceError as exc:
            logger.warning("could not unload %s from the inference server: %s", self.loaded, exc)
        shutil.rmtree(self.run_dir / "rollout-adapters", ignore_errors=True)
        self.loaded = None


def sampling_fields(
    *, n: int, max_tokens: int, temperature: float, top_p: float, stop_ids: list[int], seed: int | None
) -> dict:
    """One request's sampling settings under vLLM's names, which its `/completions` body and
    its `SamplingParams` share: `n` samples of at most `max_tokens`, stopping on `stop_ids`,
    special tokens left out of the text, seeded when `seed` is given."""
    return {
        "n": n,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "stop_token_ids": stop_ids,
        "skip_special_tokens": True,
        **({"seed": seed} if seed is not None else {}),
    }


@dataclass
class ServedRollout(Rollout):
    """A Rollout sampled by the server, with what it sampled each token from."""

    sampler_logprobs: torch.Tensor = field(default_factory=lambda: torch.zeros(0))  # (B, T), 0 on padding


def sampled_tokens(choice: dict) -> tuple[list[int], list[float]]:
    """(sampled ids, their log-probs) of one completion choice. Refused when the server
    did not return the ids or one log-prob per id: training on a re-tokenised text could
    train on tokens that were never sampled, and a missing log-prob leaves the sampler's
    distribution unknown."""
    tokens = choice.get("token_ids")
    if tokens is None:
        raise VllmError(
            "the server returned no token_ids for a sample (it must honour return_token_ids): "
            "training uses only the exact sampled ids, never a re-tokenised text"
        )
    tokens = list(tokens)
    values = list((choice.get("logprobs") or {}).get("token_logprobs") or [])
    if len(values) != len(tokens) or any(v is None for v in values):
        raise VllmError(f"the server returned {len(values)} log-probs for {len(tokens)} sampled ids")
    return tokens, [float(v) for v in values]


def _choices(response: httpx.Response) -> list[dict]:
    """A completion's choices, or the inference client's bad-answer error for a body that
    is not one."""
    try:
        choices = response.json()["choices"]
    except (ValueError, KeyError, TypeError):
        raise InferenceBadAnswer(f"the completion's answer has no choices: {response.text[:300]}") from None
    if not isinstance(choices, list) or not choices or not all(isinstance(c, dict) for c in choices):
        raise InferenceBadAnswer(f"the completion's answer has no choices: {response.text[:300]}")
    return choices
