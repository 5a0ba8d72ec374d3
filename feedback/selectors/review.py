"""What the trace detail page shows: the conversation as turns, with each turn's tool
calls, comments, ratings, corrections and customer feedback, in a constant number of
queries whatever the size of the trace."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Q
from django.db.models.fields.json import KT
from django.db.models.functions import Length, Substr

from feedback.models import (
    Comment,
    Correction,
    CustomerFeedback,
    Grade,
    Message,
    Trace,
    TraceFlag,
    TraceSource,
    TurnRating,
)
from feedback.permissions import can_see_customer_feedback
from webapp.kernel.chat_format import MAX_JSON_DEPTH, json_depth, json_loads_bounded

# Characters of a message shown before "show more"; the rest is fetched on demand.
HEAD_CHARS = 2_000
# Tool-call arguments are pretty-printed up to this size.
MAX_PRETTY_CHARS = 20_000
# Messages shown on one page of a trace: a long trace (thousands of messages) is read and
# rendered a page at a time, never whole.
TURNS_PER_PAGE = 200


def pretty_json(text: str) -> str:
    """Indent a JSON string for reading; anything else (too long, nested too deeply to
    walk, not JSON) comes back as it was."""
    if not isinstance(text, str) or len(text) > MAX_PRETTY_CHARS:
        return text
    try:
        return json_pretty(json_loads_bounded(text))
    except (ValueError, TypeError):
        return text


def json_pretty(value: Any, *, sort_keys: bool = False) -> str:
    """Indented JSON of a stored value, for a page. Never raises: a value nested too deeply
    to indent (stored before ingest bounded depth) is shown compact, or as a placeholder."""
    if json_depth(value) <= MAX_JSON_DEPTH:
        try:
            return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=sort_keys)
        except (ValueError, TypeError, RecursionError):
            pass
    try:
        return json.dumps(value, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError):
        return f"(not shown: nested more than {MAX_JSON_DEPTH} levels deep)"


@dataclass(slots=True)
class ToolCallView:
    id: str
    name: str
    arguments: str
    result_position: int | None = None


@dataclass(slots=True)
class RatingSummary:
    up: int = 0
    down: int = 0
    scores: list[int] = field(default_factory=list)

    @property
    def score_mean(self) -> float | None:
        return sum(self.scores) / len(self.scores) if self.scores else None


@dataclass(slots=True)
class Turn:
    message: Message
    head: str
    length: int
    tool_calls: list[ToolCallView]
    # For a tool message: the call it answers (its name and the assistant turn's position).
    answers: ToolCallView | None = None
    answers_position: int | None = None
    comments: list[Comment] = field(default_factory=list)
    corrections: list[Correction] = field(default_factory=list)
    feedback: list[CustomerFeedback] = field(default_factory=list)
    ratings: RatingSummary = field(default_factory=RatingSummary)
    my_rating: TurnRating | None = None

    @property
    def truncated(self) -> bool:
        return self.length > len(self.head)

    @property
    def is_assistant(self) -> bool:
        return self.message.role == "assistant"


@dataclass(slots=True)
class TraceReview:
    trace: Trace
    turns: list[Turn]
    feedback: list[CustomerFeedback]
    flags: list[TraceFlag]
    tools: list[dict[str, Any]]
    duration_s: float | None
    page: int = 1
    pages: int = 1
    forked_from: Trace | None = None  # the trace this one forks (id and external id loaded)
    forks: list[Trace] = field(default_factory=list)  # forks of this one, oldest first (at most 50)
    first_position: int = 0  # of this page
    last_position: int = -1
    timeline: list[TimelineBar] = field(default_factory=list)
    grades: list[Grade] = field(default_factory=list)

    @property
    def metadata_json(self) -> str:
        """The trace's metadata as indented JSON (the page escapes it)."""
        return json_pretty(self.trace.metadata, sort_keys=True)

    @property
    def page_numbers(self) -> list[int]:
        return list(range(1, self.pages + 1))


def trace_page_count(trace: Trace, page_size: int = TURNS_PER_PAGE) -> int:
    return max(1, -(-trace.message_count // page_size))


@dataclass(frozen=True, slots=True)
class TimelineBar:
    """One assistant turn on the trace's latency timeline: where it starts and how long it
    took, in ms from the trace's start and as percentages of the span drawn."""

    position: int
    start_ms: float
    latency_ms: float
    left_pct: float
    width_pct: float


def trace_timeline(*, trace: Trace, turns: list[Turn]) -> tuple[list[TimelineBar], float | None]:
    """The assistant turns' latencies laid out in time, and the span they cover (seconds).

    A turn captured by the gateway carries the time its request started
    (`raw.practicum.started_at`, epoch seconds); a turn without it is drawn right after the
    previous one, so an ingested trace still shows how its time was spent."""
    timed = [t for t in turns if t.is_assistant and t.message.latency_ms is not None]
    if not timed:
        return [], None
    starts = dict(
        Message.objects.filter(pk__in=[t.message.pk for t in timed]).values_list("pk", KT("raw__practicum__started_at"))
    )
    origin = trace.started_at.timestamp()
    spans: list[tuple[int, float, float]] = []
    cursor = 0.0
    for t in timed:
        try:
            start = (float(starts.get(t.message.pk)) - origin) * 1000.0
        except (TypeError, ValueError):
            start = cursor
        start = max(start, 0.0)
        spans.append((t.message.position, start, float(t.message.latency_ms)))
        cursor = max(cursor, start + float(t.message.latency_ms))
    total = max(cursor, 1e-9)
    bars = [
        TimelineBar(pos, start, latency, round(100 * start / total, 2), max(round(100 * latency / total, 2), 0.5))
        for pos, start, latency in spans
    ]
    return bars, cursor / 1000.0


def trace_page_of(position: int, page_size: int = TURNS_PER_PAGE) -> int:
    """The page that shows the message at `position`."""
    return position // page_size + 1


def trace_turns(
    *, trace: Trace, positions: list[int] | None = None, between: tuple[int, int] | None = None
) -> list[Turn]:
    """The trace's messages as turns (only `positions`, or positions in `between` =
    [first, stop), when given), without their annotations; message text is cut to HEAD_CHARS
    in the database."""
    qs = (
        Message.objects.filter(trace=trace)
        .select_related("model_version")
        .annotate(content_length=Length("content"), content_head=Substr("content", 1, HEAD_CHARS))
        .only(
            "id",
            "trace_id",
            "position",
            "role",
            "name",
            "tool_calls",
            "tool_call_id",
            "response_id",
            "latency_ms",
            "finish_reason",
            "usage",
            "model_version__name",
        )
        .order_by("position")
    )
    if positions is not None:
        qs = qs.filter(position__in=positions)
    if between is not None:
        qs = qs.filter(position__gte=between[0], position__lt=between[1])
    turns = []
    for m in qs:
        calls = [
            ToolCallView(
                c.get("id", ""),
                c.get("function", {}).get("name", ""),
                pretty_json(c.get("function", {}).get("arguments", "")),
            )
            for c in (m.tool_calls or [])
        ]
        turns.append(Turn(message=m, head=m.content_head or "", length=m.content_length or 0, tool_calls=calls))
    return turns


def _link_tool_calls(turns: list[Turn]) -> None:
    calls: dict[str, tuple[ToolCallView, int]] = {}
    for t in turns:
        for c in t.tool_calls:
            calls[c.id] = (c, t.message.position)
        if t.message.role == "tool" and t.message.tool_call_id in calls:
            call, position = calls[t.message.tool_call_id]
            call.result_position = t.message.position
            t.answers, t.answers_position = call, position


def turn_annotate(*, turns: list[Turn], trace: Trace, user) -> None:
    """Attach comments, ratings, corrections and message-level customer feedback."""
    by_id = {t.message.id: t for t in turns}
    ids = list(by_id)
    for c in Comment.objects.filter(trace=trace, message_id__in=ids).select_related("author", "resolved_by"):
        by_id[c.message_id].comments.append(c)
    for c in Correction.objects.filter(trace=trace, message_id__in=ids).select_related("author"):
        by_id[c.message_id].corrections.append(c)
    for r in TurnRating.objects.filter(trace=trace, message_id__in=ids):
        turn = by_id[r.message_id]
        if r.kind == "thumbs":
            if r.value > 0:
                turn.ratings.up += 1
            else:
                turn.ratings.down += 1
        else:
            turn.ratings.scores.append(r.value)
        if r.user_id == user.pk:
            turn.my_rating = r


def trace_review(*, trace: Trace, user, page: int = 1, page_size: int = TURNS_PER_PAGE) -> TraceReview:
    """One page of the trace (`page_size` messages, 1-based `page`, clamped to the pages there are)."""
    pages = trace_page_count(trace, page_size)
    page = min(max(1, page), pages)
    first = (page - 1) * page_size
    turns = trace_turns(trace=trace, between=(first, first + page_size))
    _link_tool_calls(turns)
    turn_annotate(turns=turns, trace=trace, user=user)
    trace_feedback = []
    by_id = {t.message.id: t for t in turns}
    # Customers' words and references are for roles that hold the permission to read them
    # (reviewers and approvers see the conversation, not what customers said about it).
    feedback = CustomerFeedback.objects.filter(trace=trace).order_by("-created_at", "-id")
    for f in feedback if can_see_customer_feedback(user) else feedback.none():
        if f.message_id in by_id:
            by_id[f.message_id].feedback.append(f)
        trace_feedback.append(f)
    # Its parent and its forks in one query (the FK's index serves `forked_from`).
    related = (
        Trace.objects.filter(Q(id=trace.forked_from_id) | Q(forked_from=trace))
        .only("id", "external_id", "forked_from_id", "forked_at", "started_at")
        .order_by("started_at", "id")[:51]
    )
    parent = None
    forks = []
    for other in related:
        if other.id == trace.forked_from_id:
            parent = other
        else:
            forks.append(other)
    timeline, span_s = trace_timeline(trace=trace, turns=turns)
    # A gateway trace's end is its last answer; older gateway traces have no `ended_at`, so
    # their duration comes from the timeline of their turns.
    if trace.ended_at:
        duration = (trace.ended_at - trace.started_at).total_seconds()
    else:
        duration = span_s if trace.source == TraceSource.GATEWAY else None
    return TraceReview(
        trace=trace,
        turns=turns,
        feedback=trace_feedback,
        flags=list(TraceFlag.objects.filter(trace=trace).order_by("name")),
        tools=[
            {
                "name": (tool.get("function") or {}).get("name", ""),
                "description": (tool.get("function") or {}).get("description", ""),
                "parameters": json_pretty((tool.get("function") or {}).get("parameters") or {}),
            }
            for tool in (trace.tools or [])
            if isinstance(tool, dict)
        ],
        duration_s=duration,
        page=page,
        pages=pages,
        forked_from=parent,
        forks=forks[:50],
        first_position=first,
        last_position=first + len(turns) - 1,
        timeline=timeline,
        grades=list(Grade.objects.filter(trace=trace).order_by("name")),
    )


def turn_single(*, trace: Trace, position: int, user) -> Turn | None:
    """One turn with its annotations, for an htmx partial after a change."""
    turns = trace_turns(trace=trace, positions=[position])
    if not turns:
        return None
    turn_annotate(turns=turns, trace=trace, user=user)
    return turns[0]


def tool_names(trace: Trace) -> list[str]:
    return [
        tool["function"]["name"]
        for tool in trace.tools or []
        if isinstance(tool, dict) and isinstance(tool.get("function"), dict) and tool["function"].get("name")
    ]


def trace_by_id(trace_id: int) -> Trace | None:
    return Trace.objects.select_related("deployment", "model_version").filter(pk=trace_id).first()
