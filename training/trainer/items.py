"""What a job trains on, independent of the database: one assistant turn in context."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from training.trainer.graders import grade


@dataclass
class TurnItem:
    """A logged context up to an assistant turn (or a replayable task's prompt).

    - GRPO scores fresh samples under `rubric` (judge) or with `grader` + `reference`.
    - SFT trains on `target` (a corrected response).
    - Self-distillation uses `feedback` as the teacher's hint.
    """

    id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    rubric: str = ""
    reference: str | None = None
    grader: str = ""
    feedback: str = ""
    target: str | None = None
    logged_response: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "messages": self.messages,
            "tools": self.tools,
            "rubric": self.rubric,
            "reference": self.reference,
            "grader": self.grader,
            "feedback": self.feedback,
            "target": self.target,
            "logged_response": self.logged_response,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TurnItem:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


# score_group(item, candidates) -> one reward per candidate, in order.
Scorer = Callable[[TurnItem, list[str]], list[float]]


def judge_scorer(score_candidates: Callable[[list[dict], str, list[str]], list[float]]) -> Scorer:
    """Adapt a judge's `score_candidates(context_messages, rubric, candidates)`."""

    def score(item: TurnItem, candidates: list[str]) -> list[float]:
        return [float(r) for r in score_candidates(item.messages, item.rubric, candidates)]

    return score


def grader_scorer(default_grader: str = "") -> Scorer:
    """Score with each item's programmatic grader against its reference answer."""

    def score(item: TurnItem, candidates: list[str]) -> list[float]:
        name = item.grader or default_grader
        return [grade(name, c, item.reference or "") for c in candidates]

    return score


def with_hint(messages: list[dict[str, Any]], hint: str, *, at: str = "system") -> list[dict[str, Any]]:
    """The context with `hint` added to its system message (one is created if absent), or,
    at="last", after the whole context as a user message (where the turn is decided: a
    small model reads it there far more than in the system message, though not
    necessarily as what it says, docs/experiments/2026-12-02-comment-hints.md)."""
    if at == "last":
        return [*messages, {"role": "user", "content": hint}]
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{hint}".strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": hint}, *messages]


def canary_items(canaries: list[dict[str, Any]]) -> list[TurnItem]:
    """A config's canary prompts as graded items."""
    return [
        TurnItem(
            id=f"canary-{i}",
            messages=c.get("messages") or [{"role": "user", "content": str(c["prompt"])}],
            reference=str(c.get("reference", "")),
            grader=c["grader"],
        )
        for i, c in enumerate(canaries)
    ]
