"""Responses of a model version to an evaluation item, and the log-probs of given tokens.

Two generators with one interface:

- `ServerGenerator` asks the inference server (vLLM), with the version's adapter loaded by
  name — what customers would get. Log-probs of the candidate's tokens under the baseline
  come from a one-token completion with `prompt_logprobs`.
- `LocalGenerator` runs the version in this process with transformers (+ peft for LoRA
  adapters), on the CPU or a GPU — for machines without a running server. Imports torch,
  so only workers construct it.

Both decode greedily unless a temperature is configured.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from training.inference.client import InferenceError
from training.inference.codec import tool_calls_parse
from training.services.inference import version_server
from training.serving.models import ModelVersion, ModelVersionKind


class GenerationError(RuntimeError):
    """A version could not answer an item (the message says why)."""


@dataclass
class Generated:
    message: dict[str, Any]  # {"role": "assistant", "content": …, "tool_calls": […]}
    finish_reason: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None


class Generator(Protocol):
    name: str

    def prepare(self, version: ModelVersion) -> None: ...

    def generate(
        self, version: ModelVersion, *, messages: list[dict], tools: list[dict] | None, max_tokens: int
    ) -> Generated: ...

    def token_logprobs(
        self, version: ModelVersion, *, prompt_token_ids: list[int], token_ids: list[int]
    ) -> list[float] | None: ...

    def close(self) -> None: ...


class ServerGenerator:
    """Through the inference server that serves the version's base model."""

    name = "server"

    def __init__(self, *, temperature: float = 0.0, seed: int = 0, timeout: float = 120.0) -> None:
        self.temperature = temperature
        self.seed = seed
        self.timeout = timeout

    def prepare(self, version: ModelVersion) -> None:
        if version.kind == ModelVersionKind.FULL:
            raise GenerationError(
                f"{version.name} is a full checkpoint: the shared server serves adapters over its base only; "
                "evaluate it with the local generator (PRACTICUM_EVAL_GENERATOR=local) or register it as a "
                "base model with its own server"
            )
        if version.kind == ModelVersionKind.LORA:
            try:
                version_server(version).adapter_load(version.name, version.path)
            except InferenceError as exc:
                raise GenerationError(f"could not load {version.name} into the inference server: {exc}") from exc

    def generate(
        self, version: ModelVersion, *, messages: list[dict], tools: list[dict] | None, max_tokens: int
    ) -> Generated:
        params: dict[str, Any] = {"seed": self.seed}
        if tools:
            params["tools"] = tools
        try:
            result = version_server(version).chat(
                model=version.name,
                messages=messages,
                max_tokens=max_tokens,
                temperature=self.temperature,
                timeout=self.timeout,
                **params,
            )
        except InferenceError as exc:
            raise GenerationError(str(exc)) from exc
        message: dict[str, Any] = {"role": "assistant", "content": result.content or None}
        if result.tool_calls:
            message["tool_calls"] = [
                {"id": c.get("id", ""), "type": "function", "function": c.get("function", {})}
                for c in result.tool_calls
            ]
        return Generated(
            message=message,
            finish_reason=result.finish_reason,
            token_ids=result.token_ids,
            logprobs=result.token_logprobs,
            prompt_token_ids=result.raw.get("prompt_token_ids"),
        )

    def token_logprobs(
        self, version: ModelVersion, *, prompt_token_ids: list[int], token_ids: list[int]
    ) -> list[float] | None:
        if not token_ids:
            return None
        try:
            return version_server(version).prompt_logprobs(
                model=version.name,
                token_ids=[*prompt_token_ids, *token_ids],
                start=len(prompt_token_ids),
                timeout=self.timeout,
            )
        except InferenceError:
            return None

    def close(self) -> None:
        pass


class LocalGenerator:
    """In this process with transformers: the base model loaded once, each LoRA version
    attached as a named peft adapter, full checkpoints loaded on their own."""

    name = "local"

    def __init__(self, *, temperature: float = 0.0, seed: int = 0, device: str = "auto") -> None:
        import torch

        from training.trainer.policy import pick_device

        self.temperature = temperature
        self.seed = seed
        self.device = pick_device(device)
        self._torch = torch
        self._bases: dict[int, Any] = {}  # base model id → (model, tokenizer)
        self._full: dict[int, Any] = {}  # version id → (model, tokenizer)

    def _base(self, version: ModelVersion):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        base = version.base_model
        if base.pk not in self._bases:
            tokenizer = AutoTokenizer.from_pretrained(base.path)
            model = AutoModelForCausalLM.from_pretrained(base.path, dtype=self._torch.float32).to(self.device)
            self._bases[base.pk] = [model.eval(), tokenizer]
        return self._bases[base.pk]

    def prepare(self, version: ModelVersion) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if version.kind == ModelVersionKind.FULL:
            if version.pk not in self._full:
                tokenizer = AutoTokenizer.from_pretrained(version.path)
                model = AutoModelForCausalLM.from_pretrained(version.path, dtype=self._torch.float32)
                self._full[version.pk] = (model.to(self.device).eval(), tokenizer)
            return
        entry = self._base(version)
        if version.kind != ModelVersionKind.LORA:
            return
        from peft import PeftModel

        model = entry[0]
        if not isinstance(model, PeftModel):
            entry[0] = PeftModel.from_pretrained(model, version.path, adapter_name=version.name).eval()
        elif version.name not in model.peft_config:
            model.load_adapter(version.path, adapter_name=version.name)

    def _model(self, version: ModelVersion):
        """(callable model context, tokenizer) with the version's weights active."""
        if version.kind == ModelVersionKind.FULL:
            model, tokenizer = self._full[version.pk]
            return contextlib.nullcontext(model), tokenizer, model
        model, tokenizer = self._base(version)
        if version.kind == ModelVersionKind.LORA:
            model.set_adapter(version.name)
            return contextlib.nullcontext(model), tokenizer, model
        if hasattr(model, "disable_adapter"):
            return model.disable_adapter(), tokenizer, model
        return contextlib.nullcontext(model), tokenizer, model

    def generate(
        self, version: ModelVersion, *, messages: list[dict], tools: list[dict] | None, max_tokens: int
    ) -> Generated:
        from training.trainer.logprobs import token_logprobs
        from training.trainer.sampling import encode_prompt, eos_ids

        torch = self._torch
        context, tokenizer, model = self._model(version)
        prompt = encode_prompt(tokenizer, messages, tools)
        ends = eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else ends[0]
        ids = torch.tensor([prompt], device=self.device)
        torch.manual_seed(self.seed)
        options: dict[str, Any] = {"do_sample": False}
        if self.temperature:
            options = {"do_sample": True, "temperature": self.temperature, "top_k": 0}
        with context, torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_tokens,
                eos_token_id=ends,
                pad_token_id=pad,
                **options,
            )
            response = out[0, len(prompt) :].tolist()
            finished = bool(response) and response[-1] in ends
            full = torch.tensor([prompt + response], device=self.device)
            logprobs = (
                token_logprobs(model, full, torch.ones_like(full), keep=len(response))[0].tolist() if response else []
            )
        text = tokenizer.decode([t for t in response if t not in ends], skip_special_tokens=True)
        # As the server does: tool-call blocks become calls only when the request offered tools.
        content, calls = tool_calls_parse(text) if tools else (text, [])
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = calls
        finish = "length" if not finished else ("tool_calls" if calls else "stop")
        return Generated(
            message=message,
            finish_reason=finish,
            token_ids=response,
            logprobs=[float(x) for x in logprobs],
            prompt_token_ids=prompt,
        )

    def token_logprobs(
        self, version: ModelVersion, *, prompt_token_ids: list[int], token_ids: list[int]
    ) -> list[float] | None:
        from training.trainer.logprobs import token_logprobs

        if not token_ids:
            return None
        torch = self._torch
        context, _, model = self._model(version)
        full = torch.tensor([[*prompt_token_ids, *token_ids]], device=self.device)
        with context, torch.no_grad():
            values = token_logprobs(model, full, torch.ones_like(full), keep=len(token_ids))[0].tolist()
        return [float(v) if math.isfinite(v) else float("-inf") for v in values]

    def close(self) -> None:
        self._bases.clear()
        self._full.clear()


def same_tokenizer(a: ModelVersion, b: ModelVersion) -> bool:
    """Log-probs of one version's tokens under another mean something only when both
    read the same tokens: versions over one base model do."""
    return a.base_model_id == b.base_model_id and ModelVersionKind.FULL not in (a.kind, b.kind)
