"""Streamed downloads that stay streamed under ASGI."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Iterator

import orjson
from asgiref.sync import sync_to_async

logger = logging.getLogger(__name__)
PARQUET = "application/vnd.apache.parquet"  # the exports' Parquet files (`webapp.kernel.parquet`)


async def streamed(lines: Iterator[bytes], per_chunk: int = 200) -> AsyncIterator[bytes]:
    """`lines` a chunk at a time, each read in the ORM's thread: under ASGI a plain iterator
    given to a StreamingHttpResponse is read whole into memory before the first byte goes out.
    A failure after the first byte cannot change the status any more: the download ends with
    an `{"error": …}` line instead, so a truncated file never passes for a whole one."""
    while True:
        chunk, failure = await sync_to_async(_take, thread_sensitive=True)(lines, per_chunk)
        if chunk:
            yield b"".join(chunk)
        if failure is not None:
            logger.error("a streamed download failed", exc_info=failure)
            yield orjson.dumps({"error": f"the download stopped: {type(failure).__name__}"}) + b"\n"
            return
        if len(chunk) < per_chunk:
            return


def _take(lines: Iterator[bytes], n: int) -> tuple[list[bytes], Exception | None]:
    """Up to `n` lines, and what stopped them early if something failed (the lines read
    before it still go out)."""
    chunk: list[bytes] = []
    try:
        for line in itertools.islice(lines, n):
            chunk.append(line)
    except Exception as exc:
        return chunk, exc
    return chunk, None
