"""Bulk moves of traces as JSONL in the OpenAI chat fine-tuning format."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from feedback.models import Trace, TraceSource
from feedback.selectors import trace_as_chat_jsonl_row
from feedback.services.ingest import traces_ingest
from training.serving.models import Deployment

IMPORT_BATCH = 500


@dataclass
class ImportReport:
    created: int = 0
    exists: int = 0
    appended: int = 0
    errors: list[str] = field(default_factory=list)


def _content_id(line: bytes) -> str:
    # A line without an external_id gets one from its content, so importing the same
    # file twice stores nothing new.
    return "jsonl-" + hashlib.sha256(line.strip()).hexdigest()[:24]


def traces_import_jsonl(*, deployment: Deployment, stream: IO[bytes]) -> ImportReport:
    """Import `{"messages", "tools"?, "external_id"?, ...}` lines; bad lines are reported by number."""
    report = ImportReport()
    batch: list[tuple[int, Any]] = []

    def flush() -> None:
        results = traces_ingest(deployment=deployment, items=[item for _, item in batch], source=TraceSource.IMPORT)
        for (line_no, _), r in zip(batch, results, strict=True):
            if r.status == "error":
                for e in r.errors:
                    report.errors.append(f"line {line_no}: {e['field']}: {e['reason']}")
            else:
                setattr(report, r.status, getattr(report, r.status) + 1)
        batch.clear()

    for line_no, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            report.errors.append(f"line {line_no}: not valid JSON: {exc}")
            continue
        if isinstance(item, dict) and not item.get("external_id"):
            item["external_id"] = _content_id(line)
        batch.append((line_no, item))
        if len(batch) >= IMPORT_BATCH:
            flush()
    if batch:
        flush()
    return report


def traces_export_jsonl(*, traces: Any, stream: IO[bytes], chunk_size: int = 500) -> int:
    """Write each trace as one fine-tuning line; returns the number written."""
    n = 0
    for line in traces_jsonl_lines(traces=traces, chunk_size=chunk_size):
        stream.write(line)
        n += 1
    return n


def traces_chat_rows(*, traces: Any, limit: int | None = None, chunk_size: int = 500) -> Iterator[tuple[Trace, dict]]:
    """Each trace (in id order, at most `limit`) with its row of the OpenAI chat fine-tuning
    format, read a chunk at a time so an export of any size holds one chunk in memory."""
    # Stops at the limit before reading the next chunk, and never reads a chunk past it.
    chunk = chunk_size if limit is None else max(1, min(chunk_size, limit))
    for trace in itertools.islice(_iter_with_messages(traces, chunk), limit):
        yield trace, trace_as_chat_jsonl_row(trace)


def traces_jsonl_lines(*, traces: Any, limit: int | None = None, chunk_size: int = 500) -> Iterator[bytes]:
    """`traces_chat_rows` as JSONL lines."""
    for _, row in traces_chat_rows(traces=traces, limit=limit, chunk_size=chunk_size):
        yield orjson.dumps(row) + b"\n"


def traces_parquet(*, traces: Any, limit: int | None = None) -> IO[bytes]:
    """The same rows as Parquet (`webapp.kernel.parquet`), with each trace's id and external id."""
    from webapp.kernel.parquet import parquet_file  # noqa: PLC0415 — pyarrow (60 MB) for an export only

    rows = (
        {**row, "trace_id": trace.pk, "external_id": trace.external_id}
        for trace, row in traces_chat_rows(traces=traces, limit=limit)
    )
    return parquet_file(rows, columns={"tools": "json", "trace_id": "int", "external_id": "text"})


def _iter_with_messages(traces: Any, chunk_size: int) -> Iterator[Trace]:
    last_id = 0
    base = traces.order_by("id")
    while True:
        chunk = list(base.filter(id__gt=last_id).prefetch_related("messages")[:chunk_size])
        if not chunk:
            return
        yield from chunk
        last_id = chunk[-1].id
