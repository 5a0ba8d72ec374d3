"""The judge call's wire: every response body read through a cap on its size (compressed
bodies counted as they decode), within the attempt's time, and checked to be a chat
completion; the endpoint's `Retry-After`; the failures an attempt ends in (`Retryable`: the
call may be tried again; `Fatal`: not). feedback/judge/client.py makes the calls."""

from __future__ import annotations

import email.utils
import json
import time
import zlib
from functools import lru_cache
from typing import Any

import httpx2
import openai
import pydantic
from openai.types.chat import ChatCompletion


class Retryable(Exception):
    def __init__(self, message: str, *, retry_after: float | None = None, reask: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds the endpoint asked us to wait
        self.reask = reask  # the answer was malformed: ask again, saying why


class Fatal(Exception):
    pass


class BodyTooSlow(Exception):
    pass


class BodyTooLarge(Exception):
    def __init__(self, limit: int, message: str = "") -> None:
        super().__init__(
            message
            or f"the response body is larger than {limit} bytes (PRACTICUM_JUDGE_MAX_RESPONSE_BYTES): "
            "it was not read further"
        )


class _CappedStream(httpx2.SyncByteStream):
    """A response body that raises `BodyTooLarge` once more than `limit` bytes have come."""

    def __init__(self, stream: httpx2.SyncByteStream, limit: int, message: str = "") -> None:
        self._stream = stream
        self._limit = limit
        self._message = message

    def __iter__(self):
        seen = 0
        for chunk in self._stream:
            seen += len(chunk)
            if seen > self._limit:
                raise BodyTooLarge(self._limit, self._message)
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
def judge_openai_client(base_url: str, api_key: str, max_response_bytes: int) -> openai.OpenAI:
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


def body_read(response: Any, attempt_deadline: float, limit: int) -> bytes:
    """The whole body, or `BodyTooSlow` once the attempt's time is up: a body trickled in
    small pieces must not outlive the limit that a single read respects; or `BodyTooLarge`
    once more than `limit` bytes have been decoded (a compressed body is counted again
    here, as it grows)."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if time.monotonic() > attempt_deadline:
            raise BodyTooSlow()
    return b"".join(chunks)


def json_loads(text: str | bytes) -> Any:
    """`json.loads`, with a document nested deeper than the parser can follow refused as
    not JSON (ValueError) rather than raising RecursionError out of the call."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to read") from None


def completion_from(body: bytes) -> ChatCompletion:
    """The body as a chat completion, or a retryable failure saying what it was instead."""
    shown = body[:200].decode("utf-8", "replace")
    try:
        data = json_loads(body)
    except ValueError:
        raise Retryable(f"the response is not a chat completion (not JSON): {shown!r}") from None
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        raise Retryable(f"the response is not a chat completion (no choices): {shown!r}")
    try:
        return ChatCompletion.model_validate(data)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise Retryable(f"the response is not a chat completion ({where}: {first.get('msg', exc)})") from None


def json_parse(text: str) -> Any:
    stripped = text.strip()
    # Endpoints that ignore response_format sometimes wrap the object in a code fence.
    if stripped.startswith("```"):
        stripped = stripped.split("\n", 1)[1] if "\n" in stripped else ""
        stripped = stripped.rsplit("```", 1)[0]
    return json_loads(stripped)


def status_error(exc: openai.APIStatusError) -> str:
    text = exc.response.text if exc.response is not None else ""
    body = text[:500]
    try:  # OpenAI-compatible servers wrap the words in {"error": {"message": ...}}
        error = json_loads(text).get("error")
        body = str(error.get("message") if isinstance(error, dict) else error or body)[:500]
    except (ValueError, AttributeError):
        pass
    return f"HTTP {exc.status_code}: {body or exc.message}"
