"""Streamed downloads that stay streamed under ASGI."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async


async def streamed(lines: Iterator[bytes], per_chunk: int = 200) -> AsyncIterator[bytes]:
    """`lines` a chunk at a time, each read in the ORM's thread: under ASGI a plain iterator
    given to a StreamingHttpResponse is read whole into memory before the first byte goes out."""
    while chunk := await sync_to_async(lambda: list(itertools.islice(lines, per_chunk)))():
        yield b"".join(chunk)
