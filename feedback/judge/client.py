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
"""

from __future__ import annotations

import copy
import email.utils
import json
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Generic, TypeVar

import httpx2
import openai
import pydantic
from openai.types.chat import ChatCompletion

from feedback.judge.schemas import OutputLimits, SchemaViolation

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
        from django.conf import settings

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


class _Retryable(Exception):
    def __init__(self, message: str, *, retry_after: float | None = None, reask: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds the endpoint asked us to wait
        self.reask = reask  # the answer was malformed: ask again, saying why


class _Fatal(Exception):
    pass


class _TooSlow(Exception):
    pass


class _TooLarge(Exception):
    def __init__(self, limit: int, message: str = "") -> None:
        super().__init__(
            message
            or f"the response body is larger than {limit} bytes (PRACTICUM_JUDGE_MAX_RESPONSE_BYTES): "
            "it was not read further"
        )


class _CappedStream(httpx2.SyncByteStream):
    """A response body that raises `_TooLarge` once more than `limit` bytes have come."""

    def __init__(self, stream: httpx2.SyncByteStream, limit: int, message: str = "") -> None:
        self._stream = stream
        self._limit = limit
        self._message = message

    def __iter__(self):
        seen = 0
        for chunk in self._stream:
            seen += len(chunk)
            if seen > self._limit:
                raise _TooLarge(self._limit, self._message)
            yield chunk

    def close(self) -> None:
        self._stream.close()


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_PIECE = 64 * 1024


class _Inflated(httpx2.SyncByteStream):
    """A gzip or deflate body decoded here, at most `_PIECE` bytes at a time, so that the
    cap counts what it becomes as it grows (a small compressed body can decode to gigabytes)."""

    def __init__(self, stream: httpx2.SyncByteStream, wbits: int) -> None:
        self._stream = stream
        self._wbits = wbits

    def __iter__(self):
        inflate = zlib.decompressobj(self._wbits)
        for chunk in self._stream:
            data = chunk
            while data:
                piece = inflate.decompress(data, _PIECE)
                if piece:
                    yield piece
                data = inflate.unconsumed_tail
        tail = inflate.flush()
        if tail:
            yield tail

    def close(self) -> None:
        self._stream.close()


def _capped(response: httpx2.Response, limit: int) -> None:
    """Install the cap on a response before anything reads it: on the bytes as received and,
    for a compressed body, on the bytes it decodes to."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding in _WBITS:
        del response.headers["content-encoding"]  # decoded here, not again by the client
        response.stream = _CappedStream(_Inflated(_CappedStream(response.stream, limit), _WBITS[encoding]), limit)
    elif encoding and encoding != "identity":
        # Not asked for, and not one this module can decode with a bound on its size.
        refused = f"the response body is compressed with {encoding[:50]!r}, which was not asked for: it was not read"
        response.stream = _CappedStream(response.stream, 0, refused)
    else:
        response.stream = _CappedStream(response.stream, limit)


@lru_cache(maxsize=16)
def _client(base_url: str, api_key: str, max_response_bytes: int) -> openai.OpenAI:
    # Retries are ours (they also cover malformed output), so the SDK's are off; the
    # timeout is given per attempt. Every body is read through the cap (`_capped`), the
    # error bodies the SDK reads itself included; an uncompressed one is asked for.
    http_client = openai.DefaultHttpxClient(event_hooks={"response": [lambda r: _capped(r, max_response_bytes)]})
    return openai.OpenAI(
        base_url=base_url,
        api_key=api_key or "unset",
        max_retries=0,
        http_client=http_client,
        default_headers={"Accept-Encoding": "identity"},
    )


def retry_after_seconds(headers: Any, *, now: float | None = None) -> float | None:
    """The wait an error response asks for (`retry-after-ms`, `retry-after` in seconds or
    as an HTTP date), or None."""
    if headers is None:
        return None
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            if name != "retry-after":
                continue
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                continue
            seconds = when.timestamp() - (time.time() if now is None else now)
        if seconds == seconds and seconds >= 0:  # not NaN
            return min(seconds, 24 * 3600.0)
    return None


def _read_body(response: Any, attempt_deadline: float, limit: int) -> bytes:
    """The whole body, or `_TooSlow` once the attempt's time is up: a body trickled in
    small pieces must not outlive the limit that a single read respects; or `_TooLarge`
    once more than `limit` bytes have been decoded (a compressed body is counted again
    here, as it grows)."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise _TooLarge(limit)
        chunks.append(chunk)
        if time.monotonic() > attempt_deadline:
            raise _TooSlow()
    return b"".join(chunks)


def _json_loads(text: str | bytes) -> Any:
    """`json.loads`, with a document nested deeper than the parser can follow refused as
    not JSON (ValueError) rather than raising RecursionError out of the call."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None


def _completion_from(body: bytes) -> ChatCompletion:
    """The body as a chat completion, or a retryable failure saying what it was instead."""
    shown = body[:200].decode("utf-8", "replace")
    try:
        data = _json_loads(body)
    except ValueError:
        raise _Retryable(f"the response is not a chat completion (not JSON): {shown!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        raise _Retryable(f"the response is not a chat completion (no choices): {shown!r}")
    try:
        return ChatCompletion.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise _Retryable(f"the response is not a chat completion ({where}: {first.get('msg', exc)})") from None


def portable_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` without the bounds strict hosted subsets reject (see `_PORTABLE_DROP`)."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k not in _PORTABLE_DROP}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(copy.deepcopy(schema))


def _parse_json(text: str) -> Any:
    stripped = text.strip()
    # Endpoints that ignore response_format sometimes wrap the object in a code fence.
    if stripped.startswith("```"):
        stripped = stripped.split("\n", 1)[1] if "\n" in stripped else ""
        stripped = stripped.rsplit("```", 1)[0]
    return _json_loads(stripped)


def _status_error(exc: openai.APIStatusError) -> str:
    text = exc.response.text if exc.response is not None else ""
    body = text[:500]
    try:  # OpenAI-compatible servers wrap the words in {"error": {"message": ...}}
        error = _json_loads(text).get("error")
        body = str(error.get("message") if isinstance(error, dict) else error or body)[:500]
    except (ValueError, AttributeError):
        pass
    return f"HTTP {exc.status_code}: {body or exc.message}"


JUDGE_DOCS = "docs/how-to/connect-a-judge.md"
# What each kind of failure means for the person reading it, and what fixes it, in order of
# precedence: (a phrase of the recorded reason, lower-cased) → the words.
_EXPLAINED: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("maximum context length", "context length", "context window", "too many tokens", "prompt is too long"),
        "the judge model's context is too small for this turn — connect a judge with a longer context, or set "
        "PRACTICUM_JUDGE_CONTEXT_TOKENS to its window so the conversation is trimmed to fit",
    ),
    (
        ("http 401", "http 403"),
        "the judge endpoint refused the key — check PRACTICUM_JUDGE_API_KEY (or the deployment's judge key)",
    ),
    (
        ("http 404",),
        "the judge endpoint does not know this model or path — check PRACTICUM_JUDGE_BASE_URL (it ends in /v1) "
        "and PRACTICUM_JUDGE_MODEL",
    ),
    (("http 429",), "the judge endpoint is rate-limiting these calls — judge again later, or raise its quota"),
    (
        ("connection failed",),
        "the judge endpoint does not answer — is it running, and is PRACTICUM_JUDGE_BASE_URL right?",
    ),
    (
        ("timed out", "no time left", "would pass the deadline"),
        "the judge took too long — raise PRACTICUM_JUDGE_TIMEOUT_S and PRACTICUM_JUDGE_DEADLINE_S, or connect a "
        "faster judge",
    ),
    (
        ("cut off at max_tokens",),
        "the judge's answer was cut off at its token limit — raise PRACTICUM_JUDGE_MAX_TOKENS, or connect a "
        "stronger judge that answers briefly",
    ),
    (
        ("not json", "does not match the schema", "empty output", "no choices"),
        "the judge did not answer in the required JSON — connect a model that follows structured output",
    ),
    (("the judge refused",), "the judge model refused to judge this turn — judge again, or connect another judge"),
    (("http 5",), "the judge endpoint had an error of its own — judge again later"),
    (
        ("practicum_judge_max_response_bytes",),
        "the judge's answer was larger than allowed — raise PRACTICUM_JUDGE_MAX_RESPONSE_BYTES, or lower "
        "PRACTICUM_JUDGE_MAX_TOKENS",
    ),
)


def failure_explained(reason: str) -> str:
    """The recorded `reason` of a failed judge call in words, with what fixes it and where
    to read more, followed by the endpoint's own words; a reason already explained is kept."""
    if JUDGE_DOCS in reason:
        return reason
    lowered = reason.lower()
    for phrases, words in _EXPLAINED:
        if any(phrase in lowered for phrase in phrases):
            return f"{words} (see {JUDGE_DOCS}). The judge said: {reason}"
    return f"the judge call failed (see {JUDGE_DOCS}). The judge said: {reason}"


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
    client = _client(endpoint.base_url, endpoint.api_key, endpoint.max_response_bytes).with_options(timeout=budget_s)
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
                body = _read_body(raw_response, attempt_deadline, endpoint.max_response_bytes)
        except _TooLarge as exc:
            raise _Fatal(str(exc)) from exc
        except (openai.APITimeoutError, _TooSlow) as exc:
            raise _Retryable(f"timed out after {budget_s:g} s") from exc
        except openai.APIConnectionError as exc:
            raise _Retryable(f"connection failed: {exc.__cause__ or exc}") from exc
        except openai.APIStatusError as exc:
            if exc.status_code >= 500 or exc.status_code in _TRANSIENT_STATUS:
                wait = retry_after_seconds(exc.response.headers if exc.response is not None else None)
                raise _Retryable(_status_error(exc), retry_after=wait) from exc
            raise _Fatal(_status_error(exc)) from exc
        except Exception as exc:  # anything else the transport raises is a failed attempt too
            raise _Retryable(f"the call failed: {type(exc).__name__}: {exc}") from exc
        response = _completion_from(body)
        if response.model:
            record.served_model = response.model
        if response.usage is not None:
            record.prompt_tokens += response.usage.prompt_tokens or 0
            record.completion_tokens += response.usage.completion_tokens or 0
        if not response.choices:
            raise _Retryable("the response has no choices")
        choice = response.choices[0]
        finish = choice.finish_reason or ""
        text = choice.message.content or ""
        refusal = getattr(choice.message, "refusal", None)
        if refusal:
            raise _Retryable(f"the judge refused: {refusal[:300]}")
        if finish == "length":
            raise _Retryable(f"output cut off at max_tokens ({endpoint.max_tokens})", reask=True)
        if not text.strip():
            raise _Retryable("empty output")
        try:
            data = _parse_json(text)
        except (json.JSONDecodeError, ValueError) as exc:
            raise _Retryable(f"output is not JSON: {exc}", reask=True) from exc
        try:
            value = parse(data)
        except SchemaViolation as exc:
            raise _Retryable(f"output does not match the schema: {exc}", reask=True) from exc
        except RecursionError:
            raise _Retryable("output does not match the schema: nested too deeply to check", reask=True) from None
    except (_Retryable, _Fatal) as exc:
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
        except _Fatal as exc:
            last_error = str(exc)
            break
        except _Retryable as exc:
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
