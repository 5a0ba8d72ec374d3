"""The student-teacher gap: does an operator's comment, in the model's own context, move it
to the right action? Comment-conditioned distillation and hinted GRPO can only teach what
the comment changes in the model's own distribution (docs/experiments/2026-12-02-comment-hints.md),
so the gap is measured before a job is offered:

    gap = mean_i P(right action | context_i + comment_i) - mean_i P(right action | context_i)

over decision contexts of the support desk (the turn right after the lookup, where the
policy refunds or answers). P(right action) is read off one forward pass: P(refund) is the
probability that the turn opens a tool call (the first token of `<tool_call>`: after the
lookup, the only call is the refund; the whole call's text would also measure how the model
spells it, which is not the decision), as docs/experiments/2026-12-02-comment-hints.md read
it; P(right) is P(refund) where the policy refunds, 1 - P(refund) where it does not. The
comment is the simulated lead's specific comment on the wrong turn there, placed as the
jobs place it (`hint_template`, `hint_at`): the best case for the hint, so a gap below the
threshold is a clear no.

`student_teacher_gap` is the pure part; `gap_probe_run` loads a model and measures it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from training.environments.support_desk import SupportDesk, oracle_turns
from training.environments.support_operator import operator_comment
from training.trainer.items import with_hint

REFUND_OPENING = '<tool_call>{"name": "issue_refund"'
DEFAULT_CONTEXTS = 40
HINT_TEMPLATE = "Feedback on earlier answers, follow it: {feedback}"


@dataclass(frozen=True, slots=True)
class ProbeCase:
    kind: str  # the order's kind (support_desk.KINDS)
    acts: bool  # whether the policy refunds here
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    comment: str


@dataclass(frozen=True, slots=True)
class GapResult:
    n: int
    p_with: float  # mean P(right action) with the comment in context (the teacher)
    p_without: float  # the same without it (the student)
    gap: float
    per_kind: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def right_probability(p_refund: float, acts: bool) -> float:
    """P(the right action) at a decision where the only choice is refund or not."""
    return p_refund if acts else 1.0 - p_refund


def student_teacher_gap(
    *, p_with: Sequence[float], p_without: Sequence[float], kinds: Sequence[str] | None = None
) -> GapResult:
    """Mean P(right | comment) - mean P(right | none) over paired contexts, overall and per
    kind. ValueError when the lists are empty or not paired."""
    if not p_with or len(p_with) != len(p_without):
        raise ValueError("p_with and p_without must be non-empty and of the same length")
    kinds = list(kinds) if kinds is not None else ["all"] * len(p_with)
    if len(kinds) != len(p_with):
        raise ValueError("kinds must pair with the probabilities")
    for p in (*p_with, *p_without):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"a probability must lie in [0, 1], not {p}")
    per_kind: dict[str, dict[str, float]] = {}
    for kind in sorted(set(kinds)):
        pick = [i for i, k in enumerate(kinds) if k == kind]
        w = sum(p_with[i] for i in pick) / len(pick)
        wo = sum(p_without[i] for i in pick) / len(pick)
        per_kind[kind] = {"n": len(pick), "p_with": w, "p_without": wo, "gap": w - wo}
    mean_with = sum(p_with) / len(p_with)
    mean_without = sum(p_without) / len(p_without)
    return GapResult(
        n=len(p_with), p_with=mean_with, p_without=mean_without, gap=mean_with - mean_without, per_kind=per_kind
    )


def _wrong_turn(order_id: str, refund: bool) -> dict[str, Any]:
    if refund:  # the policy refunds: the wrong turn refuses
        return {"role": "assistant", "content": "I am sorry, this order cannot be refunded."}
    arguments = json.dumps({"order_id": order_id})
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_wrong", "type": "function", "function": {"name": "issue_refund", "arguments": arguments}}
        ],
    }


def probe_cases(*, count: int = DEFAULT_CONTEXTS, split: str = "train", seed: int = 0) -> list[ProbeCase]:
    """`count` decision contexts of the support desk's `split` (graded refund requests, a
    seeded draw), each with the simulated lead's specific comment on the wrong turn there."""
    desk = SupportDesk()
    tasks = desk.tasks_for(split=split, graded=True)
    tasks = random.Random(seed).sample(tasks, len(tasks))
    out: list[ProbeCase] = []
    for task in tasks:
        if len(out) >= count:
            break
        decision = next((t for t in oracle_turns(task=task, env=desk) if t["messages"][-1].get("role") == "tool"), None)
        if decision is None:
            continue
        messages = decision["messages"]
        wrong = _wrong_turn(task.hidden["order_id"], bool(task.hidden["refund"]))
        comment = operator_comment(
            task=task, messages=[*messages, wrong], rng=random.Random(task.id), vague_rate=0, wrong_rate=0, env=desk
        )
        if comment is None:
            continue
        out.append(
            ProbeCase(
                kind=task.hidden["kind"],
                acts=bool(task.hidden["refund"]),
                messages=messages,
                tools=task.tools,
                comment=comment.body,
            )
        )
    return out


def probe_gap(
    *,
    cases: Sequence[ProbeCase],
    p_refund: Callable[[list[dict[str, Any]], list[dict[str, Any]]], float],
    hint_template: str = HINT_TEMPLATE,
    hint_at: str = "system",
) -> GapResult:
    """The gap over `cases`, with `p_refund(messages, tools)` the model's probability of
    starting the refund call."""
    p_with, p_without = [], []
    for case in cases:
        hinted = with_hint(case.messages, hint_template.format(feedback=case.comment), at=hint_at)
        p_with.append(right_probability(p_refund(hinted, case.tools), case.acts))
        p_without.append(right_probability(p_refund(case.messages, case.tools), case.acts))
    return student_teacher_gap(p_with=p_with, p_without=p_without, kinds=[c.kind for c in cases])


def refund_scorer(model, tokenizer) -> Callable[[list[dict[str, Any]], list[dict[str, Any]]], float]:
    """`p_refund(messages, tools)` for a loaded causal LM: the probability that the turn
    opens a tool call (the first token of `REFUND_OPENING`) after the chat template's
    assistant header."""
    import torch

    from training.trainer.sampling import encode_prompt

    opening = tokenizer.encode(REFUND_OPENING, add_special_tokens=False)[:1]
    device = next(model.parameters()).device

    def p_refund(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> float:
        prompt = encode_prompt(tokenizer, messages, tools)
        ids = torch.tensor([prompt + opening], device=device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(opening, device=device)[:, None])
        return float(torch.exp(logp.sum()).clamp(0.0, 1.0))

    return p_refund


def gap_probe_run(
    *,
    model_path: str,
    adapter: str = "",
    count: int = DEFAULT_CONTEXTS,
    split: str = "train",
    seed: int = 0,
    hint_template: str = HINT_TEMPLATE,
    hint_at: str = "system",
) -> GapResult:
    """Load the model at `model_path` (with the LoRA `adapter`, if any) and measure its gap."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    cases = probe_cases(count=count, split=split, seed=seed)
    return probe_gap(
        cases=cases, p_refund=refund_scorer(model, tokenizer), hint_template=hint_template, hint_at=hint_at
    )
