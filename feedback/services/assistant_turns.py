"""The assistant turns of a gateway exchange: the answer (a response, or a stream's chunks, or
the error a client saw) as messages with their serving data (version, token ids, per-token
log-probs, latency, finish reason, usage)."""

from __future__ import annotations

from typing import Any

from feedback.gateway.exchange import Exchange, ExchangeStatus
from webapp.kernel.chat_format import ParsedMessage


def _serving(ex: Exchange, response_id: str, finish_reason: str, usage: Any) -> dict[str, Any]:
    return {
        "response_id": response_id,
        "model_version_id": ex.version_id,
        "latency_ms": round(ex.latency_ms, 3),
        "finish_reason": finish_reason,
        "usage": usage if isinstance(usage, dict) else None,
    }


def _assistant(
    ex: Exchange,
    *,
    content: str | None,
    tool_calls: list[dict[str, Any]] | None,
    serving: dict[str, Any],
    token_ids: list[int] | None,
    logprobs: list[dict[str, Any]] | None,
    gateway: dict[str, Any],
) -> ParsedMessage:
    raw: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        raw["tool_calls"] = tool_calls
    # When the request started (epoch seconds): the trace page's latency timeline.
    raw["practicum"] = {"params": ex.params, "status": ex.status, "started_at": round(ex.started_at, 6), **gateway}
    if ex.ttft_ms is not None:
        raw["practicum"]["ttft_ms"] = round(ex.ttft_ms, 3)
    serving = dict(serving)
    if token_ids:
        serving["token_ids"] = token_ids
    if logprobs:
        serving["token_logprobs"] = [float(t.get("logprob", 0.0)) for t in logprobs]
    calls = [
        {
            "id": c.get("id") or "",
            "type": c.get("type") or "function",
            "function": {
                "name": (c.get("function") or {}).get("name") or "",
                "arguments": (c.get("function") or {}).get("arguments") or "",
            },
        }
        for c in tool_calls or []
    ]
    return ParsedMessage(
        role="assistant",
        content=content or "",
        content_parts=None,
        name="",
        tool_calls=calls or None,
        tool_call_id="",
        raw=raw,
        serving=serving,
    )


def _from_response(ex: Exchange, body: dict[str, Any]) -> list[ParsedMessage]:
    out = []
    choices = sorted(body.get("choices") or [], key=lambda c: c.get("index", 0))
    undelivered = ex.status == ExchangeStatus.PARTIAL  # the client left before the answer was sent
    for choice in choices:
        message = choice.get("message") or {}
        finish = "client_disconnect" if undelivered else choice.get("finish_reason") or ""
        out.append(
            _assistant(
                ex,
                content=message.get("content"),
                tool_calls=message.get("tool_calls") or None,
                serving=_serving(ex, str(body.get("id", "")), finish, body.get("usage")),
                token_ids=choice.get("token_ids"),
                logprobs=(choice.get("logprobs") or {}).get("content"),
                gateway={"choice": choice.get("index", 0), "n": len(choices)},
            )
        )
    return out


def _from_chunks(ex: Exchange, chunks: list[dict[str, Any]]) -> list[ParsedMessage]:
    """Reassemble streamed choices: text and tool-call argument fragments are concatenated."""
    choices: dict[int, dict[str, Any]] = {}
    response_id, usage = "", None
    for chunk in chunks:
        response_id = response_id or str(chunk.get("id", ""))
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices") or []:
            state = choices.setdefault(
                c.get("index", 0), {"text": [], "calls": {}, "finish": "", "ids": [], "logprobs": []}
            )
            delta = c.get("delta") or {}
            if delta.get("content"):
                state["text"].append(delta["content"])
            for tc in delta.get("tool_calls") or []:
                call = state["calls"].setdefault(tc.get("index", 0), {"id": "", "name": "", "arguments": []})
                call["id"] = tc.get("id") or call["id"]
                function = tc.get("function") or {}
                call["name"] = function.get("name") or call["name"]
                if function.get("arguments"):
                    call["arguments"].append(function["arguments"])
            if c.get("finish_reason"):
                state["finish"] = c["finish_reason"]
            if c.get("token_ids"):
                state["ids"].extend(c["token_ids"])
            if c.get("logprobs") and c["logprobs"].get("content"):
                state["logprobs"].extend(c["logprobs"]["content"])
    out = []
    for index in sorted(choices):
        s = choices[index]
        calls = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": "".join(c["arguments"])}}
            for _, c in sorted(s["calls"].items())
        ]
        finish = s["finish"]
        if ex.status == ExchangeStatus.PARTIAL and not finish:
            finish = "client_disconnect"
        elif ex.status == ExchangeStatus.ERROR and not finish:
            finish = "error"
        out.append(
            _assistant(
                ex,
                content="".join(s["text"]) or None,
                tool_calls=calls or None,
                serving=_serving(ex, response_id, finish, usage),
                token_ids=s["ids"],
                logprobs=s["logprobs"],
                gateway={"choice": index, "n": len(choices), "streamed": True},
            )
        )
    return out


def exchange_assistant_turns(ex: Exchange) -> list[ParsedMessage]:
    """One assistant message per returned choice; a failed call with no output gets one
    marked turn (`finish_reason` `error`, the error kept in `raw.practicum.error`)."""
    if ex.response is not None:
        turns = _from_response(ex, ex.response)
    elif ex.chunks:
        turns = _from_chunks(ex, ex.chunks)
    else:
        turns = []
    if ex.status != ExchangeStatus.OK:
        for turn in turns:
            turn.raw["practicum"]["error"] = ex.error
    if not turns and ex.status != ExchangeStatus.OK:
        finish = "client_disconnect" if ex.status == ExchangeStatus.PARTIAL else "error"
        turns = [
            _assistant(
                ex,
                content=None,
                tool_calls=None,
                serving=_serving(ex, str((ex.error or {}).get("response_id", "")), finish, None),
                token_ids=None,
                logprobs=None,
                gateway={"error": ex.error},
            )
        ]
    return turns
