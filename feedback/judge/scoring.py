"""Judging one logged turn from feedback, and scoring a group of candidate responses
under a rubric (what GRPO calls for every sampled group).

Both are plain functions over chat messages (no database), so a training worker can
call them with contexts it replays. The Django services in `feedback.services.judging`
wrap `judge_turn` with storage.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from feedback.judge.actions import action_space_schema, conversation_ids, parse_action_judgement
from feedback.judge.client import CallRecord, JudgeEndpoint, call_structured
from feedback.judge.guards import master_key_reason
from feedback.judge.prompts import (
    CURRENT_ACTION,
    CURRENT_SCORE,
    CURRENT_TURN,
    FeedbackItem,
    Prompt,
    score_prompt_messages,
    turn_prompt_messages,
)
from feedback.judge.schemas import (
    Rubric,
    SchemaViolation,
    TurnJudgement,
    group_scores_schema,
    parse_group_scores,
    parse_turn_judgement,
    turn_judgement_schema,
)
from feedback.schema_validation import tool_arguments_error, tool_parameter_schemas
from training.inference.codec import tool_call_blocks

Candidate = str | dict[str, Any]
MAX_GROUP = 32


def _candidate_text(candidate: Candidate) -> tuple[str, bool]:
    if isinstance(candidate, str):
        return candidate, False
    if isinstance(candidate, dict):
        content = candidate.get("content") or ""
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        return str(content), bool(candidate.get("tool_calls"))
    raise TypeError(f"a candidate is a string or an assistant message dict, not {type(candidate).__name__}")


@dataclass(slots=True)
class TurnOutcome:
    judgement: TurnJudgement
    # Set when the logged turn was content-free: the reward is then 0 whatever the judge said.
    guard_reason: str | None
    raw: str
    data: Any
    record: CallRecord
    prompt_version: str
    # In "actions" mode, the action chosen (`ChosenAction.as_dict()`); None otherwise.
    action: dict[str, Any] | None = None

    @property
    def reward(self) -> float:
        return 0.0 if self.guard_reason else self.judgement.reward


# Characters a token stands for, counted low: English averages 3 to 4 with a large vocabulary,
# the demo's tiny model (1,024 tokens) about 1.75; fewer makes a prompt fit with room to spare.
CHARS_PER_TOKEN = 1.5
# What the chat template adds around the messages, in tokens.
TEMPLATE_TOKENS = 32


def prompt_chars(endpoint: JudgeEndpoint) -> int:
    """How many characters of prompt fit in the judge's context beside its answer (0: no
    limit known). A prompt that still does not fit fails with the judge's words for it."""
    if endpoint.context_tokens <= 0:
        return 0
    return max(1, int((endpoint.context_tokens - endpoint.max_tokens - TEMPLATE_TOKENS) * CHARS_PER_TOKEN))


def judge_turn(
    *,
    context: Sequence[dict[str, Any]],
    turn: dict[str, Any],
    feedback: Sequence[FeedbackItem],
    endpoint: JudgeEndpoint,
    tools: Sequence[dict[str, Any]] = (),
    prompt: Prompt = CURRENT_TURN,
) -> TurnOutcome:
    """Rubric, reward and (when implied) a corrected response for the assistant `turn`
    that answered `context`, from the `feedback` people gave; with an endpoint in "actions"
    mode, the corrected turn is chosen among the agent's actions (`judge_turn_action`).
    Raises `JudgeCallFailed`."""
    if endpoint.correction_mode == "actions":
        return judge_turn_action(context=context, turn=turn, feedback=feedback, endpoint=endpoint, tools=tools)
    messages = turn_prompt_messages(
        context=context, turn=turn, feedback=feedback, tools=tools, prompt=prompt, max_chars=prompt_chars(endpoint)
    )
    schema = turn_judgement_schema(endpoint.limits)
    result = call_structured(
        endpoint=endpoint,
        messages=messages,
        schema_name="turn_judgement",
        schema=schema,
        parse=lambda data: correction_calls_check(parse_turn_judgement(data, schema), tools),
    )
    text, has_calls = _candidate_text(turn)
    return TurnOutcome(
        judgement=result.value,
        guard_reason=master_key_reason(text, has_tool_calls=has_calls),
        raw=result.raw,
        data=result.data,
        record=result.record,
        prompt_version=prompt.version,
    )


def judge_turn_action(
    *,
    context: Sequence[dict[str, Any]],
    turn: dict[str, Any],
    feedback: Sequence[FeedbackItem],
    endpoint: JudgeEndpoint,
    tools: Sequence[dict[str, Any]] = (),
    prompt: Prompt = CURRENT_ACTION,
) -> TurnOutcome:
    """The action the `feedback` asks for instead of `turn`, chosen within the agent's
    action space (its `tools`, ids copied from `context`, or a reply) under structured
    output, rendered as the corrected response; the reward of the logged turn; a one-line
    rubric naming the action. Raises `JudgeCallFailed`."""
    ids = conversation_ids(context)
    schema = action_space_schema(tools=tools, ids=ids, limits=endpoint.limits)
    messages = turn_prompt_messages(
        context=context, turn=turn, feedback=feedback, tools=tools, prompt=prompt, max_chars=prompt_chars(endpoint)
    )
    result = call_structured(
        endpoint=endpoint,
        messages=messages,
        schema_name="action_judgement",
        schema=schema,
        parse=lambda data: parse_action_judgement(data, schema=schema, tools=tools, ids=ids),
    )
    judgement, action = result.value
    text, has_calls = _candidate_text(turn)
    return TurnOutcome(
        judgement=judgement,
        guard_reason=master_key_reason(text, has_tool_calls=has_calls),
        raw=result.raw,
        data=result.data,
        record=result.record,
        prompt_version=prompt.version,
        action=action.as_dict(),
    )


# How judge-turn/v1 showed a call; text like it is no call an agent can make.
BRACKET_CALL = re.compile(r"\[calls tool ")


def served_calls_problem(text: str, tools: Sequence[dict[str, Any]]) -> str | None:
    """Why the `<tool_call>` blocks of `text` are not calls the agent could have made, or
    None when they are (or there are none): each block closed, a JSON object naming one of
    `tools`, with arguments that are an object (not a string holding one) meeting that
    tool's parameters — what an operator's corrected call is held to — and no call written
    as judge-turn/v1 showed calls."""
    if BRACKET_CALL.search(text):
        return 'write a tool call as a <tool_call> block, not "[calls tool …]"'
    blocks = tool_call_blocks(text)
    if not blocks:
        return None
    schemas = tool_parameter_schemas(list(tools))
    if not schemas:
        return "calls a tool, but the conversation offers none"
    for block in blocks:
        if not block.parsed or not text[block.start : block.end].endswith("</tool_call>"):
            return "a <tool_call> block is not a closed JSON object with a name"
        if block.name not in schemas:
            return f"calls {block.name!r}, which is not one of the tools offered"
        arguments = {} if block.arguments is None else block.arguments
        if not isinstance(arguments, dict):
            return f"the arguments of {block.name!r} are not a JSON object"
        error = tool_arguments_error(schemas[block.name], arguments)
        if error is not None:
            return f"arguments of {block.name!r}: {error.message[:200]}"
    return None


def correction_calls_check(judgement: TurnJudgement, tools: Sequence[dict[str, Any]]) -> TurnJudgement:
    """The judgement, or `SchemaViolation` (the judge is asked again) when its corrected
    response holds a call the model could not have made (`served_calls_problem`). A
    correction trains the model as it is written: a malformed call would teach malformed calls."""
    problem = served_calls_problem(judgement.corrected_response or "", tools)
    if problem is not None:
        raise SchemaViolation(f"corrected_response: {problem}")
    return judgement


@dataclass(slots=True)
class CandidateScores(Sequence[float]):
    """Scores in the order the candidates were given (the judge saw them shuffled).

    Behaves as a sequence of floats (`list(result)`, `result[i]`, `len(result)`).
    `presented` lists input indices in the order the judge saw them; `guards` gives, per
    candidate, why it was scored 0 without asking the judge (None when judged).
    """

    scores: list[float]
    reasons: list[str]
    guards: list[str | None]
    presented: list[int]
    record: CallRecord | None
    raw: str
    prompt_version: str

    def __getitem__(self, index):  # type: ignore[override]
        return self.scores[index]

    def __len__(self) -> int:
        return len(self.scores)

    def __iter__(self) -> Iterator[float]:
        return iter(self.scores)


def score_candidates(
    context: Sequence[dict[str, Any]],
    rubric: Rubric | dict[str, Any] | list[dict[str, Any]] | str,
    candidates: Sequence[Candidate],
    *,
    endpoint: JudgeEndpoint | None = None,
    tools: Sequence[dict[str, Any]] = (),
    rng: random.Random | None = None,
    order: Sequence[int] | None = None,
    prompt: Prompt = CURRENT_SCORE,
) -> CandidateScores:
    """Score every candidate response to `context` under `rubric` in one judge call.

    - `context`: the chat messages (OpenAI format) the candidates answer.
    - `rubric`: a stored judge rubric (`{"criteria": [...]}`), a list of criteria, or text.
    - `candidates`: response texts, or assistant message dicts (which may carry tool calls).

    Candidates are shown to the judge in a random order (`rng`, or a fixed `order` of input
    indices for order-swap checks) and the scores are mapped back to the input order.
    Content-free candidates (see `guards.master_key_reason`) get 0 without being shown.
    Raises `JudgeCallFailed` when the judge gives no valid answer: never default scores.
    """
    if not candidates:
        raise ValueError("score_candidates needs at least one candidate")
    if len(candidates) > MAX_GROUP:
        raise ValueError(f"at most {MAX_GROUP} candidates per call, got {len(candidates)}")
    rubric = Rubric.from_data(rubric)
    guards = []
    for candidate in candidates:
        text, has_calls = _candidate_text(candidate)
        guards.append(master_key_reason(text, has_tool_calls=has_calls))
    judged = [i for i, g in enumerate(guards) if g is None]
    if order is not None:
        if sorted(order) != judged:
            raise ValueError(f"order must be a permutation of the judged candidates {judged}")
        presented = list(order)
    else:
        presented = judged[:]
        (rng or random.Random()).shuffle(presented)

    scores = [0.0] * len(candidates)
    reasons = [f"not judged: {g}" if g else "" for g in guards]
    if not presented:
        return CandidateScores(scores, reasons, guards, [], None, "", prompt.version)

    endpoint = endpoint or JudgeEndpoint.from_settings()
    n = len(presented)
    result = call_structured(
        endpoint=endpoint,
        messages=score_prompt_messages(
            context=context,
            rubric_text=rubric.as_text(),
            presented=[candidates[i] for i in presented],
            tools=tools,
            prompt=prompt,
        ),
        schema_name="candidate_scores",
        schema=group_scores_schema(n),
        parse=lambda data: parse_group_scores(data, n),
    )
    for label, item in result.value.items():
        index = presented[label - 1]
        scores[index] = item.score
        reasons[index] = item.reason
    return CandidateScores(scores, reasons, guards, presented, result.record, result.raw, prompt.version)


@dataclass(frozen=True, slots=True)
class SwapCheck:
    """The same candidates judged in two orders (the second the reverse of the first)."""

    first: CandidateScores
    second: CandidateScores
    pair_agreement: float | None  # share of candidate pairs ranked the same way both times
    mean_abs_diff: float  # mean |score difference| per candidate


def pairwise_order_agreement(a: Sequence[float], b: Sequence[float], *, tie: float = 1e-9) -> float | None:
    """Share of pairs (i < j) whose order (higher, lower or tied within `tie`) is the same
    under scores `a` and `b`; None when there is no pair."""
    if len(a) != len(b):
        raise ValueError("score lists differ in length")

    def sign(x: float) -> int:
        return 0 if abs(x) <= tie else (1 if x > 0 else -1)

    pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a))]
    if not pairs:
        return None
    same = sum(sign(a[i] - a[j]) == sign(b[i] - b[j]) for i, j in pairs)
    return same / len(pairs)


def order_swap_check(
    context: Sequence[dict[str, Any]],
    rubric: Rubric | dict[str, Any] | list[dict[str, Any]] | str,
    candidates: Sequence[Candidate],
    *,
    endpoint: JudgeEndpoint | None = None,
    tools: Sequence[dict[str, Any]] = (),
    rng: random.Random | None = None,
) -> SwapCheck:
    """Score `candidates` twice, the second time in the reverse of the first order, and
    say how consistent the judge was. A position-biased judge disagrees with itself."""
    first = score_candidates(context, rubric, candidates, endpoint=endpoint, tools=tools, rng=rng)
    second = score_candidates(
        context, rubric, candidates, endpoint=endpoint, tools=tools, order=list(reversed(first.presented))
    )
    judged = first.presented
    a = [first.scores[i] for i in judged]
    b = [second.scores[i] for i in judged]
    diff = sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a) if a else 0.0
    return SwapCheck(first=first, second=second, pair_agreement=pairwise_order_agreement(a, b), mean_abs_diff=diff)
