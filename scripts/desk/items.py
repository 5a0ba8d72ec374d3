"""The training sets: the hidden policy's turns and their counterfactual copies (oracle
labels), the decision points a policy note labels (words only) and the check that a
words-only set holds nothing else, and the base model's own answers to mix in."""

from __future__ import annotations

import json
import random
from pathlib import Path

from desk.harness import MAX_TURN_TOKENS, Harness
from desk.recipes import NOTES


def oracle_items(
    tasks,
    *,
    prefix: str,
    variants: int = 0,
    near_line: int = 0,
    rng: random.Random | None = None,
    cases: tuple[int, ...] = tuple(range(8)),
):
    """One SFT item per oracle turn of each task (see `oracle_turns`), and `variants`
    counterfactual copies of each decision point (`counterfactual_turns`, drawn over
    `cases`), and `near_line` more drawn near the refund window's line."""
    from training.environments.support_desk import NEAR_LINE_CASES, SupportDesk, counterfactual_turns, oracle_turns
    from training.trainer.items import TurnItem

    env = SupportDesk()
    rng = rng or random.Random(0)
    items = []
    for task in tasks:
        for k, turn in enumerate(oracle_turns(task=task, env=env)):
            extra = counterfactual_turns(task=task, messages=turn["messages"], count=variants, rng=rng, cases=cases)
            if near_line:
                extra += counterfactual_turns(
                    task=task, messages=turn["messages"], count=near_line, rng=rng, cases=NEAR_LINE_CASES
                )
            for j, t in enumerate([turn, *extra]):
                items.append(
                    TurnItem(
                        id=f"{prefix}:{task.id}:{k}" + (f":v{j}" if j else ""),
                        messages=t["messages"],
                        tools=task.tools,
                        target=t["target"],
                        reference=t["reference"],
                        grader="tool_action",
                    )
                )
    return items


def note_of(arm: str, seed: int, *, prompt: str, path: Path = NOTES):
    """The rule and text of the note `scripts/note_probe.py` logged for `arm` and `seed`
    under the policy-note prompt `prompt` (the first runs logged no prompt: v1)."""
    from training.environments.policy_rules import rule_parse

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    found = [
        r
        for r in rows
        if r["arm"] == arm and r["seed"] == seed and r.get("rule") and r.get("prompt", "policy-note/v1") == prompt
    ]
    if not found:
        raise SystemExit(f"no {arm} note with a rule for seed {seed} under {prompt} in {path}")
    return rule_parse(found[-1]["rule"]), found[-1]["text"]


def note_turn(order_id: str, refund: bool, text: str) -> tuple[str, str]:
    """(target, accepted actions) of a decision turn the note labels: the refund call on
    the order the lookup showed, or a refusal that quotes the note."""
    if refund:
        call = {"name": "issue_refund", "arguments": {"order_id": order_id}}
        return f"<tool_call>{json.dumps(call)}</tool_call>", json.dumps(
            [{"tool": "issue_refund", "arguments": {"order_id": order_id}}]
        )
    return f"I am sorry, order {order_id} cannot be refunded. {text}", json.dumps([{"reply": True}])


def _note_label(rule, messages) -> bool | None:
    from training.environments.base import DecisionContext
    from training.environments.support_desk import policy_note_label

    return policy_note_label(rule, DecisionContext(status="", x=None, messages=messages, tools=[], acts=False))


def note_items(tasks, *, rule, text: str, variants: int, rng: random.Random):
    """Words only (issue 39's A2): each training order's decision point (its request and
    the lookup of the order, as an episode logs them) and `variants` copies whose lookup
    shows another status and age, every turn labelled by the note's `rule` alone. The copies
    are drawn from the training split's statuses and day counts, as many that the note
    refunds as that it refuses (the note's own line, not the policy's); a case the rule does
    not cover is left out. No target, reference or case choice reads the hidden policy."""
    from training.environments.support_desk import SupportDesk
    from training.environments.support_desk.store import DAY_VALUES
    from training.environments.support_desk.transcripts import lookup_messages
    from training.trainer.items import TurnItem

    desk = SupportDesk()
    days = list(DAY_VALUES["train"])
    items = []
    for task in tasks:
        row = desk.table.row(task.hidden["order_id"])  # the situation: the store's order, not its answer
        first = task.first_messages()
        shown = [row]
        wanted = {True: variants // 2, False: variants - variants // 2}
        for _ in range(50 * max(1, variants)):
            if not any(wanted.values()):
                break
            status = rng.choice(["delivered", "shipped", "processing", "refunded"])
            age = rng.choice(days) if status in ("delivered", "refunded") else None
            changed = {
                **row,
                "status": status,
                "delivered_days_ago": age,
                "refunded_amount": row["price"] if status == "refunded" else 0.0,
            }
            label = _note_label(rule, [*first, *lookup_messages(row["order_id"], changed)])
            if label is not None and wanted[label] > 0:
                wanted[label] -= 1
                shown.append(changed)
        for j, looked in enumerate(shown):
            messages = [*first, *lookup_messages(row["order_id"], looked)]
            label = _note_label(rule, messages)
            if label is None:
                continue
            target, reference = note_turn(row["order_id"], label, text)
            items.append(
                TurnItem(
                    id=f"train:{task.id}:note" + (f":v{j}" if j else ""),
                    messages=messages,
                    tools=task.tools,
                    target=target,
                    reference=reference,
                    grader="tool_action",
                )
            )
    return items


def words_only_check(items, *, rule, text: str) -> None:
    """Refuse a words-only set any of whose targets is not the note's own label of its
    context (so none came from the hidden policy)."""
    for item in items:
        row = json.loads(item.messages[-1]["content"])
        label = _note_label(rule, item.messages)
        if label is None or (item.target, item.reference) != note_turn(row["order_id"], label, text):
            raise SystemExit(f"{item.id}: a target the note does not give; not a words-only set")


def base_answers(harness: Harness, tasks, *, seed: int, prefix: str):
    """The base model's own first turns on `tasks` (other turns: tracking questions), as
    SFT items that keep that behaviour."""
    import torch

    from training.trainer.items import TurnItem
    from training.trainer.sampling import encode_prompt

    harness.model.eval()
    rows = []
    for i, task in enumerate(tasks):
        generator = torch.Generator().manual_seed(seed * 7_919 + i)
        ids = encode_prompt(harness.tokenizer, task.first_messages(), task.tools)
        rows.append((ids, harness.first, generator, MAX_TURN_TOKENS))
    items = []
    for start in range(0, len(rows), 16):
        decoded = harness.decode(rows[start : start + 16])
        for task, (text, _, ended) in zip(tasks[start : start + 16], decoded, strict=True):
            if ended:
                items.append(
                    TurnItem(id=f"{prefix}:{task.id}", messages=task.first_messages(), tools=task.tools, target=text)
                )
    return items
