"""Cheap failure detectors over traces: pure functions, no database, no model.

Each per-trace detector takes a `TraceView` (messages in the OpenAI chat format, the
tool definitions) and returns `Finding`s pointing at the message they concern. The
length-outlier detector looks at a whole batch, since "unusually long" only means
something against the other answers of the same deployment.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import median
from typing import Any

from jsonschema import Draft202012Validator

from feedback.schema_validation import UnusableSchema, schema_errors, schema_validator
from webapp.kernel.chat_format import json_loads_bounded

TOOL_ERROR = "tool_error"
INVALID_TOOL_ARGS = "invalid_tool_args"
EMPTY_ANSWER = "empty_answer"
TRUNCATED = "truncated"
REFUSAL = "refusal"
LENGTH_OUTLIER = "length_outlier"
KINDS = (TOOL_ERROR, INVALID_TOOL_ARGS, EMPTY_ANSWER, TRUNCATED, REFUSAL, LENGTH_OUTLIER)

# Modified z-score cut-off (Iglewicz & Hoaglin): |0.6745 (x - median) / MAD| > 3.5.
OUTLIER_Z = 3.5
OUTLIER_MIN_BATCH = 20
# The spread of log lengths is taken as at least this much. An agent that answers mostly
# from templates has a MAD near 0, and then every answer that is not a template (74 support
# traces: 23 flagged) looked like an outlier. With the floor an answer must also be at least
# exp(3.5 * 0.35 / 0.6745) = 6.1 times longer, or shorter, than the median to be flagged.
OUTLIER_MIN_LOG_MAD = 0.35

_REFUSAL = re.compile(
    r"\b(?:I(?:'m| am) (?:sorry,? (?:but )?)?(?:not able|unable) to (?:help|assist|comply|do that|provide)"
    r"|I (?:can(?:'|no)t|cannot|won't|will not) (?:help|assist|comply|do that|provide|answer|fulfil)"
    r"|I'm sorry,? but I (?:can(?:'|no)t|cannot|won't)"
    r"|as an AI(?: language model)?,? I (?:can(?:'|no)t|cannot|am unable|don't))",
    re.IGNORECASE,
)
_ERROR_TEXT = re.compile(
    r"^\s*(?:error\b|exception\b|traceback \(most recent call last\)|\d{3} [A-Z][a-z]+ Error)", re.I
)


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    position: int | None  # the message it concerns
    detail: str


@dataclass(slots=True)
class TraceView:
    trace_id: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    group: str = ""  # traces are compared for length within a group (the deployment)


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


def _tool_error_detail(content: str) -> str | None:
    stripped = content.strip()
    if stripped.startswith("{"):
        try:
            data = json_loads_bounded(stripped)
        except ValueError:
            data = None
        if isinstance(data, dict):
            error = data.get("error") or data.get("errors")
            if error:
                return f"tool returned an error: {str(error)[:200]}"
            status = data.get("status")
            if isinstance(status, str) and status.lower() in {"error", "failed", "failure"}:
                return f"tool returned status {status!r}"
            if data.get("ok") is False or data.get("success") is False:
                return "tool reported failure"
            return None
    if _ERROR_TEXT.match(stripped):
        return f"tool returned an error: {stripped[:200]}"
    return None


def detect_tool_errors(trace: TraceView) -> list[Finding]:
    out = []
    for pos, m in enumerate(trace.messages):
        if m.get("role") == "tool":
            detail = _tool_error_detail(_text(m))
            if detail:
                out.append(Finding(TOOL_ERROR, pos, detail))
    return out


def _validators(tools: Sequence[dict[str, Any]]) -> dict[str, Draft202012Validator | None]:
    # Most traces of a deployment share one tool list: build its validators once.
    try:
        key = json.dumps(tools, sort_keys=True)
    except (TypeError, ValueError):
        return _build_validators(tools)
    return _cached_validators(key)


@lru_cache(maxsize=64)
def _cached_validators(tools_json: str) -> dict[str, Draft202012Validator | None]:
    return _build_validators(json.loads(tools_json))


def _build_validators(tools: Sequence[dict[str, Any]]) -> dict[str, Draft202012Validator | None]:
    out: dict[str, Draft202012Validator | None] = {}
    for tool in tools:
        fn = tool.get("function") or {}
        name = fn.get("name")
        if not isinstance(name, str):
            continue
        params = fn.get("parameters")
        if not isinstance(params, dict):
            out[name] = None
            continue
        try:
            out[name] = schema_validator(params)
        except UnusableSchema:
            # A broken schema in the agent's tool list says nothing about this call.
            out[name] = None
    return out


def detect_invalid_tool_args(trace: TraceView) -> list[Finding]:
    """Calls to a tool the trace did not define, arguments that are not a JSON object,
    and arguments that break the tool's JSON Schema. Traces without tool definitions
    are only checked for JSON."""
    validators = _validators(trace.tools)
    out = []
    for pos, m in enumerate(trace.messages):
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            fn = call.get("function") or {}
            name = fn.get("name", "")
            raw = fn.get("arguments", "")
            if trace.tools and name not in validators:
                out.append(Finding(INVALID_TOOL_ARGS, pos, f"call to undefined tool {name[:80]!r}"))
                continue
            try:
                args = json_loads_bounded(raw) if isinstance(raw, str) and raw.strip() else (raw or {})
            except ValueError as exc:
                out.append(Finding(INVALID_TOOL_ARGS, pos, f"{name[:80]}: arguments are not JSON ({exc})"))
                continue
            if not isinstance(args, dict):
                out.append(Finding(INVALID_TOOL_ARGS, pos, f"{name[:80]}: arguments are not a JSON object"))
                continue
            validator = validators.get(name)
            if validator is None:
                continue
            try:
                error = next(iter(schema_errors(validator, args)), None)
            except UnusableSchema:
                continue  # a schema that refers outside itself says nothing about this call
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path) or "(arguments)"
                out.append(Finding(INVALID_TOOL_ARGS, pos, f"{name[:80]}: {where}: {error.message[:200]}"))
    return out


def detect_empty_or_truncated(trace: TraceView) -> list[Finding]:
    out = []
    for pos, m in enumerate(trace.messages):
        if m.get("role") != "assistant":
            continue
        if m.get("finish_reason") == "length":
            out.append(Finding(TRUNCATED, pos, "the answer stopped at the token limit (finish_reason=length)"))
        elif not _text(m).strip() and not m.get("tool_calls") and not m.get("refusal"):
            out.append(Finding(EMPTY_ANSWER, pos, "empty assistant answer"))
    return out


def detect_refusals(trace: TraceView) -> list[Finding]:
    out = []
    for pos, m in enumerate(trace.messages):
        if m.get("role") != "assistant":
            continue
        if m.get("refusal"):
            out.append(Finding(REFUSAL, pos, f"refused: {str(m['refusal'])[:200]}"))
            continue
        match = _REFUSAL.search(_text(m)[:2000])
        if match:
            out.append(Finding(REFUSAL, pos, f"refusal phrase: {match.group(0)[:120]!r}"))
    return out


PER_TRACE_DETECTORS = (detect_tool_errors, detect_invalid_tool_args, detect_empty_or_truncated, detect_refusals)


def final_answer(trace: TraceView) -> tuple[int, str] | None:
    """The last assistant turn with text: the answer a user finally saw."""
    for pos in range(len(trace.messages) - 1, -1, -1):
        m = trace.messages[pos]
        if m.get("role") == "assistant" and _text(m).strip():
            return pos, _text(m)
    return None


def modified_z_scores(values: Sequence[float], *, min_mad: float = 0.0) -> list[float]:
    """0.6745 (x - median) / max(MAD, min_mad); all zeros when that is 0 (half the values
    equal and no floor)."""
    if not values:
        return []
    med = median(values)
    mad = max(median(abs(v - med) for v in values), min_mad)
    if mad == 0:
        return [0.0] * len(values)
    return [0.6745 * (v - med) / mad for v in values]


def detect_length_outliers(traces: Iterable[TraceView]) -> dict[int, list[Finding]]:
    """Final answers whose length (in characters, on a log scale) is an outlier among the
    batch's answers of the same group. Groups under `OUTLIER_MIN_BATCH` answers are
    not judged: there is no "usual" length to compare with."""
    groups: dict[str, list[tuple[int, int, int]]] = {}
    for trace in traces:
        answer = final_answer(trace)
        if answer is not None:
            groups.setdefault(trace.group, []).append((trace.trace_id, answer[0], len(answer[1])))
    out: dict[int, list[Finding]] = {}
    for rows in groups.values():
        if len(rows) < OUTLIER_MIN_BATCH:
            continue
        lengths = [r[2] for r in rows]
        med = median(lengths)
        for (trace_id, pos, length), z in zip(
            rows, modified_z_scores([math.log1p(n) for n in lengths], min_mad=OUTLIER_MIN_LOG_MAD), strict=True
        ):
            if abs(z) > OUTLIER_Z:
                direction = "long" if z > 0 else "short"
                out.setdefault(trace_id, []).append(
                    Finding(LENGTH_OUTLIER, pos, f"unusually {direction}: {length} characters (median {med:g})")
                )
    return out


def detect_batch(traces: Sequence[TraceView]) -> dict[int, list[Finding]]:
    """Every detector over a batch: trace id → its findings (traces without any are absent)."""
    out: dict[int, list[Finding]] = {}
    for trace in traces:
        found = [f for detector in PER_TRACE_DETECTORS for f in detector(trace)]
        if found:
            out[trace.trace_id] = found
    for trace_id, found in detect_length_outliers(traces).items():
        out.setdefault(trace_id, []).extend(found)
    return out
