"""Every call to the inference server (a vLLM OpenAI-compatible server) goes through here.

Timeouts on every call, bounded retries for calls that are safe to repeat, typed results,
and one error type per failure kind. Synchronous (workers, commands, tests); the gateway has
its own async path for forwarding completions. Imports no torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from django.conf import settings

RETRY_STATUSES = frozenset({502, 503, 504})


class InferenceError(Exception):
    """The inference server answered with an error (status and its message)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class InferenceUnavailable(InferenceError):
    """The inference server could not be reached (down, starting, or timed out)."""


@dataclass(frozen=True, slots=True)
class ServedModel:
    id: str
    root: str
    parent: str | None


@dataclass(frozen=True, slots=True)
class ChatResult:
    id: str
    model: str
    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    token_ids: list[int]
    token_logprobs: list[float]
    usage: dict[str, Any]
    raw: dict[str, Any] = field(repr=False)


def _base(base_url: str | None) -> str:
    return (base_url or settings.INFERENCE_URL).rstrip("/")


def auth_headers(api_key: str | None = None) -> dict[str, str]:
    """The inference server's own key (`settings.INFERENCE_API_KEY`), as vLLM expects it."""
    key = settings.INFERENCE_API_KEY if api_key is None else api_key
    return {"Authorization": f"Bearer {key}"} if key else {}


def _request(
    method: str,
    url: str,
    *,
    json: Any = None,
    timeout: float,
    retries: int,
    accept: Callable[[httpx.Response], bool] | None = None,
) -> httpx.Response:
    """One HTTP call with `retries` more attempts on connection errors and 502/503/504."""
    delay = 0.5
    for attempt in range(retries + 1):
        try:
            response = httpx.request(method, url, json=json, timeout=timeout, headers=auth_headers())
        except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError, httpx.TimeoutException) as exc:
            if attempt == retries:
                raise InferenceUnavailable(f"inference server unreachable at {url}: {exc!r}") from exc
        else:
            if response.status_code < 400 or (accept is not None and accept(response)):
                return response
            if response.status_code not in RETRY_STATUSES or attempt == retries:
                raise InferenceError(_error_message(response), status=response.status_code)
        time.sleep(delay)
        delay = min(delay * 2, 4.0)
    raise AssertionError("unreachable")


def _error_message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}: {response.text[:300]}"
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            return f"HTTP {response.status_code}: {error.get('message') or error.get('detail') or error}"
        return f"HTTP {response.status_code}: {error}"
    return f"HTTP {response.status_code}: {body}"


def health(*, base_url: str | None = None, timeout: float = 2.0) -> bool:
    """True when the server answers /health with 200 (it is up and its engine alive)."""
    try:
        return httpx.get(f"{_base(base_url)}/health", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def models_list(*, base_url: str | None = None, timeout: float = 10.0, retries: int = 2) -> list[ServedModel]:
    """What the server serves: the base model and every loaded adapter (parent = its base)."""
    body = _request("GET", f"{_base(base_url)}/v1/models", timeout=timeout, retries=retries).json()
    return [ServedModel(id=m["id"], root=m.get("root") or "", parent=m.get("parent")) for m in body.get("data", [])]


def _already_loaded(response: httpx.Response) -> bool:
    return response.status_code == 400 and "already been loaded" in response.text


def adapter_load(name: str, path: str, *, base_url: str | None = None, timeout: float = 120.0) -> None:
    """Load a LoRA adapter folder under `name` (requests then name it as `model`).

    Loading a name that is already loaded is a no-op, so a retried deployment step is safe.
    """
    _request(
        "POST",
        f"{_base(base_url)}/v1/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(path)},
        timeout=timeout,
        retries=2,
        accept=_already_loaded,
    )


def _not_loaded(response: httpx.Response) -> bool:
    return response.status_code in (400, 404) and "not found" in response.text.lower()


def adapter_unload(name: str, *, base_url: str | None = None, timeout: float = 30.0) -> None:
    """Unload an adapter; unloading one that is not loaded is a no-op."""
    _request(
        "POST",
        f"{_base(base_url)}/v1/unload_lora_adapter",
        json={"lora_name": name},
        timeout=timeout,
        retries=2,
        accept=_not_loaded,
    )


def chat(
    *,
    model: str,
    messages: list[dict[str, Any]],
    base_url: str | None = None,
    max_tokens: int = 16,
    temperature: float = 0.0,
    timeout: float = 60.0,
    retries: int = 0,
    **params: Any,
) -> ChatResult:
    """One chat completion with token ids and log-probs (a smoke test, an evaluation call).

    Not retried by default: a completion is not free, and a caller that samples should
    decide itself whether a repeat is acceptable.
    """
    payload = {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "logprobs": True,
        "return_token_ids": True,
        **params,
    }
    body = _request(
        "POST", f"{_base(base_url)}/v1/chat/completions", json=payload, timeout=timeout, retries=retries
    ).json()
    choice = body["choices"][0]
    message = choice.get("message") or {}
    logprobs = (choice.get("logprobs") or {}).get("content") or []
    return ChatResult(
        id=body.get("id", ""),
        model=body.get("model", model),
        content=message.get("content") or "",
        tool_calls=message.get("tool_calls") or [],
        finish_reason=choice.get("finish_reason") or "",
        token_ids=list(choice.get("token_ids") or []),
        token_logprobs=[float(t["logprob"]) for t in logprobs],
        usage=body.get("usage") or {},
        raw=body,
    )


def prompt_logprobs(
    *,
    model: str,
    token_ids: list[int],
    start: int,
    base_url: str | None = None,
    timeout: float = 60.0,
) -> list[float]:
    """The log-probs `model` gives each of `token_ids[start:]` after the tokens before it
    (scoring a response another version wrote, for a KL estimate).

    One completion of one token over the whole sequence with `prompt_logprobs=0`: vLLM then
    returns, for every prompt position, the log-prob of the token that is there.
    """
    if not 0 < start < len(token_ids):
        raise ValueError("start must fall inside token_ids, after at least one token")
    payload = {"model": model, "prompt": token_ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    body = _request("POST", f"{_base(base_url)}/v1/completions", json=payload, timeout=timeout, retries=0).json()
    entries = body["choices"][0].get("prompt_logprobs") or []
    if len(entries) != len(token_ids):
        raise InferenceError(f"expected {len(token_ids)} prompt log-probs, got {len(entries)}")
    out = []
    for token, entry in zip(token_ids[start:], entries[start:], strict=True):
        value = (entry or {}).get(str(token))
        if not isinstance(value, dict) or "logprob" not in value:
            raise InferenceError(f"no prompt log-prob for token {token}")
        out.append(float(value["logprob"]))
    return out
