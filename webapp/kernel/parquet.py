"""Chat-format rows (the JSONL exports' lines) as a Parquet file with one fixed schema, so
every export reads the same way in pandas, DuckDB or `datasets.load_dataset("parquet", …)`.

`messages` is a list of structs (role, content, name, tool_call_id, tool_calls with their
function name and arguments as text). Everything whose shape is free (the tools' JSON
Schemas, a message's multi-part content, an item's provenance) is a JSON text column:
Parquet needs one type per column and two traces' tool schemas rarely agree on one.
The file is written a row group at a time to a temporary file, so an export of any size
holds one group in memory.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from typing import IO, Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP = 500

_CALL = pa.struct(
    [
        ("id", pa.string()),
        ("type", pa.string()),
        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
    ]
)
MESSAGE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("name", pa.string()),
        ("tool_call_id", pa.string()),
        ("tool_calls", pa.list_(_CALL)),
    ]
)


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _message(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if isinstance(calls, dict):  # some harnesses log a lone call as an object, not a list of one
        calls = [calls]
    return {
        "role": _text(message.get("role")),
        "content": _text(message.get("content")),
        "name": _text(message.get("name")),
        "tool_call_id": _text(message.get("tool_call_id")),
        "tool_calls": [_call(call) for call in calls if isinstance(call, dict)] if isinstance(calls, list) else None,
    }


def _call(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    function = function if isinstance(function, dict) else {}  # stored content is untrusted
    return {
        "id": _text(call.get("id")),
        "type": _text(call.get("type")),
        "function": {"name": _text(function.get("name")), "arguments": _text(function.get("arguments"))},
    }


def parquet_file(rows: Iterable[dict[str, Any]], *, columns: dict[str, str]) -> IO[bytes]:
    """`rows` written as Parquet (no rows: a file with the schema alone); returns the open
    temporary file, at its start.

    `columns` names every column but `messages` and its kind: "json" (any value, as JSON
    text), "text", "int", "float" or "bool". A row's missing column is null."""
    types = {"json": pa.string(), "text": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_()}
    schema = pa.schema([("messages", pa.list_(MESSAGE)), *((name, types[kind]) for name, kind in columns.items())])
    out = tempfile.TemporaryFile()  # noqa: SIM115 (returned open: the response closes it)
    writer = pq.ParquetWriter(out, schema)
    batch: list[dict[str, Any]] = []

    def flush() -> None:
        writer.write_table(pa.Table.from_pylist(batch, schema=schema))
        batch.clear()

    try:
        for row in rows:
            shaped: dict[str, Any] = {
                "messages": [_message(m) for m in row.get("messages") or [] if isinstance(m, dict)]
            }
            for name, kind in columns.items():
                value = row.get(name)
                if kind == "json" and value is not None:
                    value = orjson.dumps(value).decode()
                elif kind == "text":
                    value = _text(value)
                shaped[name] = value
            batch.append(shaped)
            if len(batch) >= ROW_GROUP:
                flush()
        if batch:
            flush()
    finally:
        writer.close()
    out.seek(0)
    return out
