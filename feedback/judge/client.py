"""The one module that talks to judge endpoints (any OpenAI-compatible chat-completions
server: a hosted model, or a model served by our own vLLM).

Every call asks for structured output (`response_format: json_schema`) and validates
what comes back against the same schema here. A call is retried, a bounded number of
times, when the transport fails in a way that may pass (timeout, connection error, 408,
429, 5xx, a 200 whose body is not a chat completion: a cut-off JSON body, a proxy's HTML
page) or when the output is malformed (not JSON, against the schema, cut off at
`max_tokens`, a refusal). A malformed answer is asked for again with the reason it was
refused, rather than with the identical prompt. Waits between attempts grow, with jitter,
and honour the endpoint's `Retry-After`. Every call has a total deadline (`deadline_s`,
all attempts and waits included) and every attempt a total time limit (`timeout_s`, the
whole body included: the clock is checked as each piece of the body arrives, so a body
trickled in slowly is cut off; a connection silent for that long ends it as a read timeout)
and a cap on the response body (`max_response_bytes`, error bodies included): a body over
it is not read further and fails the call at once.
After the last attempt it raises
`JudgeCallFailed` with the reason and every attempt's record: a caller never gets a
default value in place of a judgement. Errors that retrying cannot fix (400, 401, 403,
404, 422) fail at once.

The body's cap, time limit and decoding are `feedback/judge/wire.py`'s; a failure's words
(`failure_explained`) are `feedback/judge/failures.py`'s.
"""

from __future__ import annotations

import copy
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import openai

from feedback.judge.failures import failure_explained
from feedback.judge.schemas import OutputLimits, SchemaViolation
from feedback.judge.wire import (
    BodyTooLarge,
    BodyTooSlow,
    Fatal,
    Retryable,
    body_read,
    completion_from,
    json_parse,
    judge_openai_client,
    retry_after_seconds,
    status_error,
)

T = TypeVar("T")

RAW_KEEP_CHARS = 20000
# Keywords that hosted providers' strict structured-output subsets reject; in "portable"
# mode they are left out of the schema sent, and still enforced by the validation here.
_PORTABLE_DROP = frozenset(
    {"minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems"}
)
_TRANSIENT_STATUS = frozenset({408, 409, 429})
CORRECTION_MODES = ("text", "actions")


class JudgeNotConfigured(RuntimeError):
    """No judge endpoint is set (neither in settings nor for the deployment)."""


@dataclass(frozen=True, slots=True)
class JudgeEndpoint:
    """Where and how to call a judge. Hashable, so one HTTP client is kept per endpoint."""

    base_url: str
    model: str
    api_key: str = field(default="", repr=False)
    timeout_s: float = 60.0  # per attempt, the whole response included
    max_attempts: int = 3
    backoff_s: float = 1.0
    deadline_s: float = 300.0  # per call: every attempt and every wait between them
    max_tokens: int = 1024
    context_tokens: int = 0  # the model's context window (0: not known); prompts are fitted to it
    max_response_bytes: int = 2_000_000  # per attempt, the body as received and as decoded
    # "full" sends the whole schema (vLLM and other grammar backends enforce it);
    # "portable" drops length and range bounds that strict hosted subsets reject.
    schema_mode: str = "full"
    # "text": the judge writes the corrected turn; "actions": it chooses the turn among the
    # agent's own actions (`feedback.judge.actions`) and the product renders it.
    correction_mode: str = "text"
    price_input_per_mtok: float | None = None
    price_output_per_mtok: float | None = None
    limits: OutputLimits = field(default_factory=OutputLimits)

    @classmethod
    def from_settings(cls, **overrides: Any) -> JudgeEndpoint:
        from django.conf import settings  # noqa: PLC0415 — the judge client imports no Django but here

        values: dict[str, Any] = {
            "base_url": settings.JUDGE_BASE_URL,
            "model": settings.JUDGE_MODEL,
            "api_key": settings.JUDGE_API_KEY,
            "timeout_s": settings.JUDGE_TIMEOUT_S,
            "max_attempts": settings.JUDGE_MAX_ATTEMPTS,
            "backoff_s": settings.JUDGE_RETRY_BACKOFF_S,
            "deadline_s": settings.JUDGE_DEADLINE_S,
            "max_tokens": settings.JUDGE_MAX_TOKENS,
            "context_tokens": settings.JUDGE_CONTEXT_TOKENS,
            "max_response_bytes": settings.JUDGE_MAX_RESPONSE_BYTES,
            "schema_mode": settings.JUDGE_SCHEMA_MODE,
            "correction_mode": settings.JUDGE_CORRECTION_MODE,
            "price_input_per_mtok": settings.JUDGE_PRICE_INPUT_PER_MTOK,
            "price_output_per_mtok": settings.JUDGE_PRICE_OUTPUT_PER_MTOK,
            "limits": OutputLimits(
                max_criteria=settings.JUDGE_MAX_CRITERIA,
                rationale_max=settings.JUDGE_RATIONALE_MAX_CHARS,
                correction_max=settings.JUDGE_CORRECTION_MAX_CHARS,
            ),
        }
        # Every override given applies, empty ones included: a deployment's own endpoint
        # without a key must not be sent the settings' key.
        values.update(overrides)
        endpoint = cls(**values)
        endpoint.check()
        return endpoint

    def check(self) -> None:
        if not self.base_url or not self.model:
            raise JudgeNotConfigured(
                "no judge endpoint: set PRACTICUM_JUDGE_BASE_URL and PRACTICUM_JUDGE_MODEL "
                "(or a judge endpoint for the deployment)"
            )
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not (self.timeout_s > 0 and self.deadline_s > 0):
            raise ValueError("timeout_s and deadline_s must be positive")
        if self.max_response_bytes < 1:
            raise ValueError("max_response_bytes must be at least 1")
        if self.schema_mode not in {"full", "portable"}:
            raise ValueError(f"schema_mode must be 'full' or 'portable', not {self.schema_mode!r}")
        if self.correction_mode not in CORRECTION_MODES:
            raise ValueError(f"correction_mode must be 'text' or 'actions', not {self.correction_mode!r}")

    def with_(self, **changes: Any) -> JudgeEndpoint:
        return replace(self, **changes)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        """Cost in the currency of the configured prices, or None when prices are unset."""
        if self.price_input_per_mtok is None and self.price_output_per_mtok is None:
            return None
        return (
            prompt_tokens * (self.price_input_per_mtok or 0.0) + completion_tokens * (self.price_output_per_mtok or 0.0)
        ) / 1e6


@dataclass(frozen=True, slots=True)
class Attempt:
    number: int
    latency_ms: float
    error: str  # "" for the accepted attempt
    raw: str  # the output text (clipped), or the error body
    finish_reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "latency_ms": round(self.latency_ms, 1),
            "error": self.error,
            "raw": self.raw,
            "finish_reason": self.finish_reason,
        }


@dataclass(slots=True)
class CallRecord:
    """What every call leaves behind, success or not: attempts, tokens, time, cost."""

    model: str  # as configured; what results are grouped by
    served_model: str = ""  # as the endpoint reported it (e.g. a dated snapshot)
    attempts: list[Attempt] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None

    @property
    def latency_ms(self) -> float:
        return sum(a.latency_ms for a in self.attempts)

    @property
    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}

    def attempts_as_dicts(self) -> list[dict[str, Any]]:
        return [a.as_dict() for a in self.attempts]


@dataclass(slots=True)
class StructuredResult(Generic[T]):
    value: T
    data: Any  # the parsed JSON
    raw: str  # the accepted output text
    record: CallRecord


class JudgeCallFailed(Exception):
    """Every attempt failed; `detail` says why the last one did, as the endpoint and the
    checks here put it, and `reason` says it in words with the fix (failure_explained)."""

    def __init__(self, detail: str, record: CallRecord) -> None:
        self.detail = detail
        self.reason = failure_explained(detail)
        super().__init__(self.reason)
        self.record = record


def portable_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` without the bounds strict hosted subsets reject (see `_PORTABLE_DROP`)."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k not in _PORTABLE_DROP}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(copy.deepcopy(schema))


def _one_attempt(
    endpoint: JudgeEndpoint,
    messages: Sequence[dict[str, Any]],
    response_format: dict[str, Any],
    parse: Callable[[Any], T],
    record: CallRecord,
    number: int,
    seed: int | None,
    budget_s: float,
) -> tuple[T, Any, str]:
    client = judge_openai_client(endpoint.base_url, endpoint.api_key, endpoint.max_response_bytes).with_options(
        timeout=budget_s
    )
    started = time.perf_counter()
    attempt_deadline = time.monotonic() + budget_s
    text, finish = "", ""
    try:
        try:
            with client.chat.completions.with_streaming_response.create(
                model=endpoint.model,
                messages=list(messages),  # type: ignore[arg-type]
                response_format=response_format,  # type: ignore[arg-type]
                temperature=0.0,
                max_completion_tokens=endpoint.max_tokens,
                seed=seed,
            ) as raw_response:
                body = body_read(raw_response, attempt_deadline, endpoint.max_response_bytes)
        except BodyTooLarge as exc:
            raise Fatal(str(exc)) from exc
        except (openai.APITimeoutError, BodyTooSlow) as exc:
            raise Retryable(f"timed out after {budget_s:g} s") from exc
        except openai.APIConnectionError as exc:
            raise Retryable(f"connection failed: {exc.__cause__ or exc}") from exc
        except openai.APIStatusError as exc:
            if exc.status_code >= 500 or exc.status_code in _TRANSIENT_STATUS:
                wait = retry_after_seconds(exc.response.headers if exc.response is not None else None)
                raise Retryable(status_error(exc), retry_after=wait) from exc
            raise Fatal(status_error(exc)) from exc
        except Exception as exc:  # anything else the transport raises is a failed attempt too
            raise Retryable(f"the call failed: {type(exc).__name__}: {exc}") from exc
        response = completion_from(body)
        if response.model:
            record.served_model = response.model
        if response.usage is not None:
            record.prompt_tokens += response.usage.prompt_tokens or 0
            record.completion_tokens += response.usage.completion_tokens or 0
        if not response.choices:
            raise Retryable("the response has no choices")
        choice = response.choices[0]
        finish = choice.finish_reason or ""
        text = choice.message.content or ""
        refusal = getattr(choice.message, "refusal", None)
        if refusal:
            raise Retryable(f"the judge refused: {refusal[:300]}")
        if finish == "length":
            raise Retryable(f"output cut off at max_tokens ({endpoint.max_tokens})", reask=True)
        if not text.strip():
            raise Retryable("empty output")
        try:
            data = json_parse(text)
        except (json.JSONDecodeError, ValueError) as exc:
            raise Retryable(f"output is not JSON: {exc}", reask=True) from exc
        try:
            value = parse(data)
        except SchemaViolation as exc:
            raise Retryable(f"output does not match the schema: {exc}", reask=True) from exc
        except RecursionError:
            raise Retryable("output does not match the schema: nested too deeply to check", reask=True) from None
    except (Retryable, Fatal) as exc:
        record.attempts.append(
            Attempt(number, (time.perf_counter() - started) * 1000, str(exc), text[:RAW_KEEP_CHARS], finish)
        )
        raise
    record.attempts.append(Attempt(number, (time.perf_counter() - started) * 1000, "", text[:RAW_KEEP_CHARS], finish))
    return value, data, text


REASK_CHARS = 4000


def reask_messages(messages: Sequence[dict[str, Any]], answer: str, error: str) -> list[dict[str, Any]]:
    """The prompt again, followed by the refused answer and why it was refused, so the
    next attempt corrects it rather than repeating it."""
    return [
        *messages,
        {"role": "assistant", "content": answer[:REASK_CHARS]},
        {
            "role": "user",
            "content": f"That answer was not accepted: {error[:1000]}. Answer again with only the JSON object "
            "the schema asks for, within its limits.",
        },
    ]


def _wait_s(endpoint: JudgeEndpoint, number: int, retry_after: float | None, rng: random.Random) -> float:
    """Exponential backoff with jitter (half fixed, half random), or the endpoint's own
    `Retry-After` plus a little jitter when it asked for longer."""
    base = endpoint.backoff_s * 2 ** (number - 1)
    wait = base / 2 + rng.uniform(0, base / 2) if base > 0 else 0.0
    if retry_after is not None and retry_after >= wait:
        wait = retry_after + rng.uniform(0, min(1.0, max(retry_after, 0.01) * 0.1))
    return wait


def call_structured(
    *,
    endpoint: JudgeEndpoint,
    messages: Sequence[dict[str, Any]],
    schema_name: str,
    schema: dict[str, Any],
    parse: Callable[[Any], T],
    seed: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
    rng: random.Random | None = None,
) -> StructuredResult[T]:
    """Ask `endpoint` for JSON matching `schema`; `parse` validates it into a typed value
    (raising `SchemaViolation` when it does not fit). Raises `JudgeCallFailed`."""
    endpoint.check()
    rng = rng or random.Random()
    deadline = time.monotonic() + endpoint.deadline_s
    sent = schema if endpoint.schema_mode == "full" else portable_schema(schema)
    response_format = {"type": "json_schema", "json_schema": {"name": schema_name, "schema": sent, "strict": True}}
    record = CallRecord(model=endpoint.model)
    last_error = ""
    prompt = list(messages)
    for number in range(1, endpoint.max_attempts + 1):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            last_error = f"{last_error}; no time left for another attempt (deadline {endpoint.deadline_s:g} s)"
            break
        try:
            value, data, text = _one_attempt(
                endpoint, prompt, response_format, parse, record, number, seed, min(endpoint.timeout_s, remaining)
            )
        except Fatal as exc:
            last_error = str(exc)
            break
        except Retryable as exc:
            last_error = str(exc)
            if number == endpoint.max_attempts:
                break
            wait = _wait_s(endpoint, number, exc.retry_after, rng)
            if wait >= deadline - time.monotonic():
                last_error = f"{last_error}; waiting {wait:.1f} s before another attempt would pass the deadline"
                break
            if wait > 0:
                sleep(wait)
            bad = record.attempts[-1].raw if record.attempts else ""
            prompt = reask_messages(messages, bad, last_error) if exc.reask and bad.strip() else list(messages)
            continue
        record.cost = endpoint.cost(record.prompt_tokens, record.completion_tokens)
        return StructuredResult(value=value, data=data, raw=text, record=record)
    record.cost = endpoint.cost(record.prompt_tokens, record.completion_tokens)
    attempts = len(record.attempts)
    raise JudgeCallFailed(f"{last_error} (after {attempts} attempt{'s' if attempts != 1 else ''})", record)
