"""Every call to the inference server (a vLLM OpenAI-compatible server) goes through here.

Django-free: the web process, the workers, the commands and the trainer all use it, and
each hands over the server's URL and key (the Django side reads `settings.INFERENCE_*`, see
`training.services.inference`). Imports no torch.

Conventions, shared with the gateway's async forwarding path (`feedback.gateway.upstream`):

- A server is named by its root URL (`server_root`): API paths are `/v1/...` under it, and a
  URL given with a trailing `/v1` means the same server.
- Every request carries the server's own key as `Authorization: Bearer <key>` (`auth_headers`).
- A failure is one of three kinds: `InferenceUnavailable` (no answer: unreachable, timed
  out, or 502/503/504), `InferenceRefused` (a 4xx: this request is wrong, repeating it will not
  help) and `InferenceBadAnswer` (an answer that cannot be used: a 500, a body that is not
  the JSON expected, a connection dropped mid-response). All are `InferenceError`.
- The retry rule (`InferenceClient.request`): only an unavailable server is tried again, at
  most `retries` more times, with backoff from 0.5 s doubling to 4 s. A refusal or a bad
  answer is final. Reads and adapter loading/unloading (idempotent by name) are retried by
  default; a completion only when its caller says a repeat is acceptable.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

UNAVAILABLE_STATUSES = frozenset({502, 503, 504})
_TRANSIENT = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.TimeoutException)


class InferenceError(Exception):
    """A call to the inference server gave no usable answer; `status` is the HTTP status, if any."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class InferenceUnavailable(InferenceError):
    """No answer: the server is down, starting, overloaded (502/503/504) or did not answer in
    time (`timed_out`). The same request may succeed later."""

    def __init__(self, message: str, *, status: int | None = None, timed_out: bool = False) -> None:
        super().__init__(message, status=status)
        self.timed_out = timed_out


class InferenceRefused(InferenceError):
    """The server refused the request (a 4xx: bad parameters, unknown model, missing key)."""


class InferenceBadAnswer(InferenceError):
    """The server answered, but not with something usable (a 500, unexpected JSON, a cut-off response)."""


@dataclass(frozen=True, slots=True)
class ErrorDetail:
    message: str
    param: str | None = None
    code: str | None = None


def error_detail(status: int, content: bytes) -> ErrorDetail:
    """What an error answer says: vLLM's (OpenAI-style) `{"error": {"message", "param", "code"}}`,
    a `{"detail": ...}` body, or the start of the raw text."""
    message = f"inference server answered {status}"
    try:
        body = json.loads(content)
    except ValueError:
        if content:
            message = f"{message}: {content[:300].decode(errors='replace')}"
        return ErrorDetail(message)
    error = body.get("error", body) if isinstance(body, dict) else body
    if not isinstance(error, dict):
        return ErrorDetail(f"{message}: {error}")
    param = error.get("param") if isinstance(error.get("param"), str) else None
    code = str(error["code"]) if error.get("code") is not None else None
    return ErrorDetail(str(error.get("message") or error.get("detail") or message), param, code)


def error_for_status(status: int, content: bytes) -> InferenceError:
    """The error an answer with this status stands for (see the module docstring)."""
    detail = error_detail(status, content)
    message = f"HTTP {status}: {detail.message}"
    if status in UNAVAILABLE_STATUSES:
        return InferenceUnavailable(message, status=status, timed_out=status == 504)
    if 400 <= status < 500:
        return InferenceRefused(message, status=status)
    return InferenceBadAnswer(message, status=status)


def server_root(url: str) -> str:
    """The server's root URL, the form every caller names it by (`/v1/...` paths go under it)."""
    return url.strip().rstrip("/").removesuffix("/v1").rstrip("/")


def auth_headers(api_key: str) -> dict[str, str]:
    """The server's own key, as vLLM's `--api-key` expects it (nothing when there is no key)."""
    if any(c in api_key for c in "\r\n\0"):
        raise ValueError("the inference server's key holds a line break or NUL")
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


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


def _already_loaded(response: httpx.Response) -> bool:
    return response.status_code == 400 and "already been loaded" in response.text


def _not_loaded(response: httpx.Response) -> bool:
    # vLLM 0.32 answers 404 "The lora adapter '<name>' cannot be found."
    text = response.text.lower()
    return response.status_code in (400, 404) and ("not found" in text or "cannot be found" in text)


class InferenceClient:
    """One inference server: its root URL and key, a default timeout and retry count.

    `keep_alive=True` keeps connections open between calls (the trainer's many rollout
    requests); otherwise every call opens its own, so a short-lived caller leaves nothing open.
    """

    def __init__(
        self, url: str, *, api_key: str, timeout: float = 60.0, retries: int = 2, keep_alive: bool = False
    ) -> None:
        self.url = server_root(url)
        self.timeout = timeout
        self.retries = retries
        self._headers = auth_headers(api_key)
        self._http = httpx.Client(headers=self._headers) if keep_alive else None

    def close(self) -> None:
        if self._http is not None:
            self._http.close()

    def __enter__(self) -> InferenceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        timeout: float | None = None,
        retries: int | None = None,
        accept: Callable[[httpx.Response], bool] | None = None,
    ) -> httpx.Response:
        """`method path` (a path under the root, e.g. `/v1/models`) under the retry rule.

        Returns a 2xx response, or an error one that `accept` takes as success (loading a
        name that is already loaded); raises the `InferenceError` the failure stands for.
        """
        url = f"{self.url}{path}"
        timeout = self.timeout if timeout is None else timeout
        retries = self.retries if retries is None else retries
        delay = 0.5
        for attempt in range(retries + 1):
            try:
                if self._http is not None:
                    response = self._http.request(method, url, json=json, timeout=timeout)
                else:
                    response = httpx.request(method, url, json=json, timeout=timeout, headers=self._headers)
            except _TRANSIENT as exc:
                error: InferenceError = InferenceUnavailable(
                    f"inference server unreachable at {url}: {exc!r}",
                    timed_out=isinstance(exc, httpx.TimeoutException),
                )
                error.__cause__ = exc
            else:
                if response.status_code < 400 or (accept is not None and accept(response)):
                    return response
                error = error_for_status(response.status_code, response.content)
            if not isinstance(error, InferenceUnavailable) or attempt == retries:
                raise error
            time.sleep(delay)
            delay = min(delay * 2, 4.0)
        raise AssertionError("unreachable")

    def _json(self, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError as exc:
            raise InferenceBadAnswer(f"not JSON from {response.url}: {response.text[:300]}") from exc

    def health(self, *, timeout: float = 2.0) -> bool:
        """True when the server answers /health with 200 (it is up and its engine alive)."""
        try:
            return httpx.get(f"{self.url}/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def open_without_key(self, *, timeout: float = 5.0) -> bool:
        """True when the server answers a route outside `/v1` without the key (`GET /version`
        with no Authorization header): a vLLM server started without the key guard, whose
        `/adapters` routes would let anyone swap the adapter behind a live name. False when it
        refuses (401), or cannot be asked."""
        try:
            return httpx.get(f"{self.url}/version", timeout=timeout).is_success
        except httpx.HTTPError:
            return False

    def models(self, *, timeout: float = 10.0) -> list[ServedModel]:
        """What the server serves: the base model and every loaded adapter (parent = its base)."""
        body = self._json(self.request("GET", "/v1/models", timeout=timeout))
        try:
            return [ServedModel(id=m["id"], root=m.get("root") or "", parent=m.get("parent")) for m in body["data"]]
        except (KeyError, TypeError) as exc:
            raise InferenceBadAnswer(f"unexpected /v1/models answer: {str(body)[:300]}") from exc

    def adapter_load(self, name: str, path: str | Path, *, timeout: float = 120.0, fresh: bool = False) -> None:
        """Load the LoRA adapter folder `path` under `name` (requests then name it as `model`).

        A name that is already loaded is kept, so a retried deployment step is safe (a
        version's name stands for fixed weights). `fresh=True` is for a name whose folder was
        just written with new weights: a name already loaded is then refused, and the call is
        not repeated (a load that timed out may still have happened, and its retry would be
        refused for the load itself).
        """
        self.request(
            "POST",
            "/v1/load_lora_adapter",
            json={"lora_name": name, "lora_path": str(path)},
            timeout=timeout,
            accept=None if fresh else _already_loaded,
            retries=0 if fresh else None,
        )

    def adapter_unload(self, name: str, *, timeout: float = 30.0) -> None:
        """Unload an adapter; unloading one that is not loaded is a no-op."""
        self.request("POST", "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=timeout, accept=_not_loaded)

    def chat(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        max_tokens: int = 16,
        temperature: float = 0.0,
        timeout: float | None = None,
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
        body = self._json(self.request("POST", "/v1/chat/completions", json=payload, timeout=timeout, retries=retries))
        try:
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
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            raise InferenceBadAnswer(f"unexpected chat completion: {str(body)[:300]}") from exc

    def prompt_logprobs(
        self, *, model: str, token_ids: list[int], start: int, timeout: float | None = None
    ) -> list[float]:
        """The log-probs `model` gives each of `token_ids[start:]` after the tokens before it
        (scoring a response another version wrote, for a KL estimate).

        One completion of one token over the whole sequence with `prompt_logprobs=0`: vLLM then
        returns, for every prompt position, the log-prob of the token that is there.
        """
        if not 0 < start < len(token_ids):
            raise ValueError("start must fall inside token_ids, after at least one token")
        payload = {"model": model, "prompt": token_ids, "max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
        body = self._json(self.request("POST", "/v1/completions", json=payload, timeout=timeout, retries=0))
        try:
            entries = body["choices"][0].get("prompt_logprobs") or []
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise InferenceBadAnswer(f"unexpected completion: {str(body)[:300]}") from exc
        if len(entries) != len(token_ids):
            raise InferenceBadAnswer(f"expected {len(token_ids)} prompt log-probs, got {len(entries)}")
        out = []
        for token, entry in zip(token_ids[start:], entries[start:], strict=True):
            value = (entry or {}).get(str(token))
            if not isinstance(value, dict) or "logprob" not in value:
                raise InferenceBadAnswer(f"no prompt log-prob for token {token}")
            out.append(float(value["logprob"]))
        return out
