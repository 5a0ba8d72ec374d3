"""Structured-output schemas for the judge, and their validation into typed results.

The schemas are tight on purpose (`additionalProperties: false`, every property
required, bounded strings and arrays): loose schemas let small judge models wander
into whitespace until `max_tokens`. Property order is the order a model writes them
in, so the rationale comes before the number it justifies.

Validation is done here again even when the endpoint enforces the schema, because not
every backend enforces every keyword (numeric bounds, `minItems`), and the semantic
checks (each candidate scored exactly once) are not expressible in JSON Schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from feedback.schema_validation import UnusableSchema, schema_errors, schema_validator

RATIONALE_MAX = 800
CORRECTION_MAX = 2000
CRITERION_MAX = 240
MAX_CRITERIA = 6
SCORE_REASON_MAX = 300


class SchemaViolation(ValueError):
    """The judge's output did not match the schema or its semantic rules."""


@dataclass(frozen=True, slots=True)
class OutputLimits:
    """Bounds on what the judge may write. They cap cost and latency, and a small judge
    model needs them to stop: without a bound it can repeat a sentence to `max_tokens`."""

    max_criteria: int = MAX_CRITERIA
    criterion_max: int = CRITERION_MAX
    rationale_max: int = RATIONALE_MAX
    correction_max: int = CORRECTION_MAX


def rubric_schema(limits: OutputLimits = OutputLimits()) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["criteria"],
        "properties": {
            "criteria": {
                "type": "array",
                "minItems": 1,
                "maxItems": limits.max_criteria,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["criterion", "weight"],
                    "properties": {
                        "criterion": {"type": "string", "minLength": 3, "maxLength": limits.criterion_max},
                        "weight": {"type": "integer", "enum": [1, 2, 3]},
                    },
                },
            }
        },
    }


def turn_judgement_schema(limits: OutputLimits = OutputLimits()) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["rubric", "rationale", "reward", "corrected_response"],
        "properties": {
            "rubric": rubric_schema(limits),
            "rationale": {"type": "string", "minLength": 3, "maxLength": limits.rationale_max},
            "reward": {"type": "number", "minimum": 0, "maximum": 1},
            "corrected_response": {"type": "string", "maxLength": limits.correction_max},
        },
    }


RUBRIC_SCHEMA = rubric_schema()
TURN_JUDGEMENT_SCHEMA = turn_judgement_schema()
STORED_RUBRIC_SCHEMA = rubric_schema(OutputLimits(max_criteria=50, criterion_max=5000))

CLUSTER_NAME_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "description"],
    "properties": {
        "name": {"type": "string", "minLength": 3, "maxLength": 60},
        "description": {"type": "string", "minLength": 3, "maxLength": 240},
    },
}


def group_scores_schema(n: int) -> dict[str, Any]:
    """Scores for `n` candidates labelled 1..n, one entry each."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["scores"],
        "properties": {
            "scores": {
                "type": "array",
                "minItems": n,
                "maxItems": n,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["response", "reason", "score"],
                    "properties": {
                        "response": {"type": "integer", "enum": list(range(1, n + 1))},
                        "reason": {"type": "string", "minLength": 1, "maxLength": SCORE_REASON_MAX},
                        "score": {"type": "number", "minimum": 0, "maximum": 1},
                    },
                },
            }
        },
    }


def validate(data: Any, schema: dict[str, Any]) -> None:
    """Raise `SchemaViolation` naming the first offending path and the rule it broke."""
    try:
        errors = schema_errors(schema_validator(schema), data)
    except UnusableSchema as exc:
        raise SchemaViolation(f"(root): {exc}") from None
    if errors:
        first = errors[0]
        where = "/".join(str(p) for p in first.absolute_path) or "(root)"
        raise SchemaViolation(f"{where}: {first.message[:300]}")


@dataclass(frozen=True, slots=True)
class Criterion:
    criterion: str
    weight: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {"criterion": self.criterion, "weight": self.weight}


@dataclass(frozen=True, slots=True)
class Rubric:
    """The criteria a piece of feedback implies for one turn. Stored as JSON on the judge
    result; GRPO passes it back to `score_candidates` to score fresh samples."""

    criteria: tuple[Criterion, ...]

    @classmethod
    def from_data(cls, data: Any) -> Rubric:
        """From the stored/judge JSON form, a list of criteria, or plain text (one criterion)."""
        if isinstance(data, Rubric):
            return data
        if isinstance(data, str):
            if not data.strip():
                raise SchemaViolation("rubric: empty")
            return cls(criteria=(Criterion(criterion=data.strip(), weight=1),))
        if isinstance(data, list):
            data = {"criteria": data}
        # Structure only: a rubric stored under other output limits is still a rubric.
        validate(data, STORED_RUBRIC_SCHEMA)
        return cls(criteria=tuple(Criterion(c["criterion"].strip(), int(c["weight"])) for c in data["criteria"]))

    def as_dict(self) -> dict[str, Any]:
        return {"criteria": [c.as_dict() for c in self.criteria]}

    def as_text(self) -> str:
        return "\n".join(f"- ({c.weight}) {c.criterion}" for c in self.criteria)


@dataclass(frozen=True, slots=True)
class TurnJudgement:
    rubric: Rubric
    rationale: str
    reward: float
    # The self-distillation target when the feedback implies what the answer should have
    # been; None when it does not.
    corrected_response: str | None


def parse_turn_judgement(data: Any, schema: dict[str, Any] = TURN_JUDGEMENT_SCHEMA) -> TurnJudgement:
    validate(data, schema)
    rationale = data["rationale"].strip()
    if not rationale:
        raise SchemaViolation("rationale: blank")
    correction = data["corrected_response"].strip()
    return TurnJudgement(
        rubric=Rubric.from_data(data["rubric"]),
        rationale=rationale,
        reward=float(data["reward"]),
        corrected_response=correction or None,
    )


@dataclass(frozen=True, slots=True)
class PresentedScore:
    """One score as the judge gave it, by the label it saw (1-based, shuffled order)."""

    label: int
    score: float
    reason: str


@dataclass(frozen=True, slots=True)
class ClusterName:
    name: str
    description: str


def parse_group_scores(data: Any, n: int) -> dict[int, PresentedScore]:
    """Each label 1..n scored exactly once, or `SchemaViolation`."""
    validate(data, group_scores_schema(n))
    out: dict[int, PresentedScore] = {}
    for entry in data["scores"]:
        label = int(entry["response"])
        if label in out:
            raise SchemaViolation(f"scores: response {label} scored twice")
        out[label] = PresentedScore(label=label, score=float(entry["score"]), reason=entry["reason"].strip())
    missing = sorted(set(range(1, n + 1)) - set(out))
    if missing:
        raise SchemaViolation(f"scores: response(s) {missing} not scored")
    return out


def parse_cluster_name(data: Any) -> ClusterName:
    validate(data, CLUSTER_NAME_SCHEMA)
    name = data["name"].strip()
    if not name:
        raise SchemaViolation("name: blank")
    return ClusterName(name=name, description=data["description"].strip())
