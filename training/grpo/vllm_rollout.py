"""Rollouts through a vLLM OpenAI-compatible server (the GPU path).

Each step the current LoRA adapter is saved and loaded into the running server at
runtime (`POST /v1/load_lora_adapter`), and the step's prompts are sampled by the
server under that adapter's name; the previous step's adapter is unloaded. The
trainer then computes log-probs for the gradient itself, in its own forward pass, so
the server's sampling numerics never enter the loss.

The transport, its retry rule, the error types and adapter loading are the project's one
inference client (`training.inference.client`); the launcher is `training.inference.server`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx

from training.grpo.sampling import Rollout, eos_ids, rollout_from_tokens
from training.inference.client import InferenceClient, InferenceError

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
        name_prefix: str = "",
    ):
        """`name_prefix` goes before each adapter's name on the server ("step-N"): jobs
        sharing one server need distinct prefixes, or a later job's "step-1" is refused.
        `api_key` is the server's own key (sent as a Bearer token with every request)."""
        self.name_prefix = name_prefix
        self.base_url = base_url.rstrip("/")
        self.run_dir = run_dir
        self.server = InferenceClient(base_url, api_key=api_key, timeout=timeout, retries=retries, keep_alive=True)
        self.loaded: str | None = None
        self.base_model: str | None = None

    def _post(self, url: str, payload: dict) -> httpx.Response:
        # A sample is repeatable (another draw from the same policy), so completions are
        # retried like every other call here.
        return self.server.request("POST", url.removeprefix(self.server.url), json=payload)

    def _base_model(self) -> str:
        if self.base_model is None:
            self.base_model = self.server.models()[0].id
        return self.base_model

    def load(self, policy, *, step: int | str) -> str:
        """Make the server serve the policy's current adapter; later `complete_ids` use it."""
        return self._load_adapter(policy, step)

    def complete_ids(
        self, prompt: list[int], *, max_tokens: int, temperature: float, top_p: float, stop_ids: list[int]
    ) -> list[int]:
        """One sample continuing the token ids `prompt` under the current adapter: the ids
        sampled, with the end-of-turn id when the server stopped on it."""
        if self.loaded is None:
            raise VllmError("no adapter loaded: call load() first")
        response = self._post(
            f"{self.base_url}/completions",
            {
                "model": self.loaded,
                "prompt": prompt,
                "n": 1,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop_token_ids": stop_ids,
                "skip_special_tokens": False,
                "return_token_ids": True,
            },
        )
        if response.status_code != 200:
            raise VllmError(f"completion failed: {response.status_code} {response.text[:300]}")
        choice = response.json()["choices"][0]
        tokens = list(choice.get("token_ids") or [])
        if choice.get("finish_reason") == "stop" and (not tokens or tokens[-1] not in stop_ids):
            tokens.append(stop_ids[0])
        return tokens

    def _load_adapter(self, policy, step: int | str) -> str:
        """Save the current adapter and make the server serve it under a fresh name."""
        if policy.adapter != "lora":
            raise VllmError("vLLM rollouts need a LoRA adapter (full fine-tuning reloads weights another way)")
        name = f"{self.name_prefix}step-{step}"
        folder = self.run_dir / "rollout-adapters" / name
        shutil.rmtree(folder, ignore_errors=True)
        policy.save_pretrained(folder)
        # fresh: the folder holds new weights, so a name another run left loaded must not stand in.
        self.server.adapter_load(name, folder, fresh=True, timeout=self.server.timeout)
        if self.loaded:
            self.server.adapter_unload(self.loaded, timeout=self.server.timeout)
            shutil.rmtree(self.run_dir / "rollout-adapters" / self.loaded, ignore_errors=True)
        self.loaded = name
        return name

    def sample(self, policy, prompts: list[list[int]], *, step: int, config, num_samples: int) -> Rollout:
        model_name = self._load_adapter(policy, step)
        stop_ids = eos_ids(policy.model, policy.tokenizer)
        responses: list[list[int]] = []
        texts: list[str] = []
        for prompt in prompts:
            response = self._post(
                f"{self.base_url}/completions",
                {
                    "model": model_name,
                    "prompt": prompt,
                    "n": num_samples,
                    "max_tokens": config.max_new_tokens,
                    "temperature": config.temperature,
                    "top_p": config.top_p,
                    "stop_token_ids": stop_ids,
                    "skip_special_tokens": True,
                    "return_token_ids": True,
                    **(
                        {"structured_outputs": config.structured_outputs}
                        if getattr(config, "structured_outputs", None)
                        else {}
                    ),
                },
            )
            if response.status_code != 200:
                raise VllmError(f"completion failed: {response.status_code} {response.text[:300]}")
            for choice in sorted(response.json()["choices"], key=lambda c: c["index"]):
                tokens = choice.get("token_ids")
                if tokens is None:
                    tokens = policy.tokenizer(choice["text"], add_special_tokens=False)["input_ids"]
                tokens = list(tokens)
                if choice.get("finish_reason") == "stop" and (not tokens or tokens[-1] not in stop_ids):
                    tokens.append(stop_ids[0])
                responses.append(tokens)
                texts.append(choice["text"])
        return rollout_from_tokens(
            prompts,
            responses,
            num_samples=num_samples,
            eos_ids=stop_ids,
            pad_id=policy.tokenizer.pad_token_id,
            texts=texts,
            device=policy.device,
        )
