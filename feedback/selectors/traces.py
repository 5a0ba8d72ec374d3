"""Reads of traces and messages."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from feedback.models import Grade, Message, Trace


def trace_visible_to(user) -> QuerySet[Trace]:
    """Traces a principal may read: an API key sees its own deployment's only."""
    deployment = getattr(user, "deployment", None)
    qs = Trace.objects.select_related("deployment", "model_version")
    return qs.filter(deployment=deployment) if deployment is not None else qs


def message_as_openai(m: Message) -> dict[str, Any]:
    """A stored message in the OpenAI chat format, plus its serving data when known."""
    out: dict[str, Any] = {"role": m.role}
    out["content"] = (
        m.content_parts if m.content_parts is not None else (m.content if m.content or not m.tool_calls else None)
    )
    if m.name:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = m.tool_calls
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    return out


def trace_as_dict(trace: Trace) -> dict[str, Any]:
    messages = []
    for m in trace.messages.all().order_by("position"):
        item = message_as_openai(m)
        serving = {
            "response_id": m.response_id or None,
            "model_version": m.model_version_id,
            "finish_reason": m.finish_reason or None,
            "latency_ms": m.latency_ms,
            "usage": m.usage,
            "token_ids": m.token_ids,
            "token_logprobs": m.token_logprobs,
        }
        serving = {k: v for k, v in serving.items() if v is not None}
        if serving:
            item["serving"] = serving
        messages.append(item)
    return {
        "id": trace.id,
        "external_id": trace.external_id,
        "deployment": trace.deployment.name,
        "session_id": trace.session_id,
        "environment": trace.environment,
        "source": trace.source,
        "model": trace.model_name,
        "model_version": trace.model_version.name if trace.model_version else None,
        "status": trace.status,
        "started_at": trace.started_at.isoformat(),
        "ended_at": trace.ended_at.isoformat() if trace.ended_at else None,
        "metadata": trace.metadata,
        "tools": trace.tools,
        "message_count": trace.message_count,
        "outcome": trace.outcome or None,
        "grades": [grade_as_dict(g) for g in trace.grades.order_by("name")],
        "messages": messages,
    }


def grade_as_dict(grade: Grade) -> dict[str, Any]:
    return {
        "id": grade.id,
        "trace_id": grade.trace_id,
        "name": grade.name,
        "outcome": grade.outcome,
        "score": grade.score,
        "reason": grade.reason,
        "source": grade.source,
        "created_at": grade.created_at.isoformat(),
        "updated_at": grade.updated_at.isoformat(),
    }


def trace_as_chat_jsonl_row(trace: Trace) -> dict[str, Any]:
    """One line of the OpenAI chat fine-tuning format (`messages` and `tools`)."""
    row: dict[str, Any] = {"messages": [message_as_openai(m) for m in trace.messages.all()]}
    if trace.tools:
        row["tools"] = trace.tools
    return row
