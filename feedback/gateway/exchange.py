"""What the gateway hands to the recorder for one completion call: the request as validated,
the response as received, and its timings. Plain data, so a record can also be written to a
spill file (JSON) and read back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from webapp.kernel.chat_format import ParsedMessage, parse_message


class ExchangeStatus:
    OK = "ok"
    ERROR = "error"  # upstream down, timed out or answered with an error
    PARTIAL = "partial"  # the client disconnected during a stream


@dataclass(slots=True)
class Exchange:
    deployment_id: int
    trace_key: str  # the trace's external id (given by the client or generated)
    explicit_trace: bool  # the client named the trace: look it up and extend it
    session_id: str
    requested_model: str
    version_id: int | None
    messages: list[ParsedMessage]
    tools: list[dict[str, Any]]
    params: dict[str, Any]  # sampling parameters as the client sent them
    metadata: dict[str, Any]
    started_at: float  # epoch seconds
    latency_ms: float
    status: str = ExchangeStatus.OK
    response: dict[str, Any] | None = None  # the whole upstream body (non-streaming)
    chunks: list[dict[str, Any]] | None = None  # the upstream SSE chunks (streaming)
    ttft_ms: float | None = None
    error: dict[str, Any] | None = None  # {"status", "message", "body"?}
    api_key_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # No trace named and the deployment stitches: the recorder finds the conversation by history.
    stitch: bool = False

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__slots__}
        data["messages"] = [m.raw for m in self.messages]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Exchange:
        data = dict(data)
        data["messages"] = [parse_message(m, f"messages[{i}]") for i, m in enumerate(data["messages"])]
        return cls(**data)
