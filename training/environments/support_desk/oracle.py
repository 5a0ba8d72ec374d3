"""Oracle labels: the next turn the hidden policy accepts and writes after a context, the
turns of a task played by the policy itself, and counterfactual copies of a decision point
whose lookup shows another order state."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from typing import Any

from training.environments.base import (
    Task,
)
from training.environments.support_desk.environment import SupportDesk
from training.environments.support_desk.store import (
    REFUND_WINDOW_DAYS,
    _case,
    _expected_row,
    order_kind,
    refund_allowed,
)
from training.environments.support_desk.transcripts import _looked_up, done_actions


def turn_reference(*, task: Task, messages: list[dict[str, Any]]) -> str | None:
    """The actions the hidden policy accepts as the next assistant turn after `messages`
    (a JSON list for the `tool_action` grader), or None for a task without a grade.

    Not looked up yet: look the order up (or refund it at once when the policy allows).
    Looked up: refund it when the policy allows, else answer in words. Refunded: answer."""
    if not task.hidden.get("graded"):
        return None
    order_id = task.hidden["order_id"]
    lookup = {"tool": "lookup_order", "arguments": {"order_id": order_id}}
    refund = {"tool": "issue_refund", "arguments": {"order_id": order_id}}
    reply = {"reply": True}
    done = done_actions(messages, order_id)
    if "issue_refund" in done:
        accepted = [reply]
    elif "lookup_order" in done:
        accepted = [refund] if task.hidden["refund"] else [reply]
    else:
        accepted = [lookup, refund] if task.hidden["refund"] else [lookup]
    return json.dumps(accepted)


def turn_target(*, task: Task, messages: list[dict[str, Any]]) -> str | None:
    """A corrected response for the next assistant turn after `messages`: the first action
    `turn_reference` accepts, written the way the agent's harness writes a turn (a hermes
    tool call, or a sentence to the customer). None for a task without a grade.

    The response is a template rendered over the order the customer named and, for a
    sentence, over what the conversation's lookup returned for it (its status and days
    since delivery), so a model trained on many of them learns to copy the id it was given
    and to read the lookup, not to repeat one order's words."""
    reference = turn_reference(task=task, messages=messages)
    if reference is None:
        return None
    action = json.loads(reference)[0]
    order_id = task.hidden["order_id"]
    if "tool" in action:
        call = {"name": action["tool"], "arguments": action["arguments"]}
        return f"<tool_call>{json.dumps(call)}</tool_call>"
    if "issue_refund" in done_actions(messages, order_id):
        return f"Your refund for order {order_id} has been issued in full."
    row = _looked_up(messages, order_id)
    if row is None:
        return f"I am sorry, order {order_id} is not eligible for a refund under our policy."
    status, days = row.get("status"), row.get("delivered_days_ago")
    if status == "refunded":
        return f"Order {order_id} has already been refunded, so there is nothing more to refund."
    if status != "delivered" or days is None:
        return f"Order {order_id} is {status} and not delivered yet, so it cannot be refunded."
    return (
        f"I am sorry, order {order_id} was delivered {days} days ago, past our {REFUND_WINDOW_DAYS}-day refund window."
    )


def oracle_turns(*, task: Task, env: SupportDesk | None = None) -> list[dict[str, Any]]:
    """The turns of `task` played by the hidden policy itself (oracle labels, computed from
    the task's hidden answer, not anybody's feedback): at each point the context, the
    corrected response `turn_target` writes and the accepted actions `turn_reference`
    gives, the tool calls run in a fresh copy of the table. [] for a task without a grade.

    Contexts for an SFT set without logged traffic: every order of a split walked once."""
    env = env or SupportDesk()
    if not task.hidden.get("graded"):
        return []
    messages = task.first_messages()
    turns: list[dict[str, Any]] = []
    state = env.reset(task)
    try:
        for step in range(env.max_steps):
            reference = turn_reference(task=task, messages=messages)
            target = turn_target(task=task, messages=messages)
            if reference is None or target is None:
                break
            turns.append({"messages": [dict(m) for m in messages], "target": target, "reference": reference})
            action = json.loads(reference)[0]
            if "tool" not in action:
                break
            call_id = f"call_{step}"
            arguments = json.dumps(action["arguments"])
            messages.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": action["tool"], "arguments": arguments},
                        }
                    ],
                }
            )
            result = env.execute(state, task, action["tool"], arguments)
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "name": action["tool"], "content": result.content}
            )
    finally:
        env.close(state)
    return turns


NEAR_LINE_CASES = (3, 4)  # `_case`'s cases 22-30 and 31-40 days after delivery


def counterfactual_turns(
    *,
    task: Task,
    messages: list[dict[str, Any]],
    count: int,
    rng: random.Random,
    cases: tuple[int, ...] = tuple(range(8)),
) -> list[dict[str, Any]]:
    """`count` copies of a decision point (`messages` ends with the lookup of the task's
    order) whose lookup shows another status and delivery age, drawn over `cases` of the
    store's eight (all by default, two of them near the refund window's line, on either
    side: `NEAR_LINE_CASES`), each with the corrected response and accepted actions the
    hidden policy gives for that row.

    Oracle labels, for training only: the same request, id and customer with only the
    looked-up facts changed, so the one thing that separates the targets is what the
    policy reads (the status and days since delivery), not which order it is."""
    order_id = task.hidden.get("order_id")
    last = messages[-1] if messages else {}
    # Only a context that ends with the lookup (a logged trace may hold anything after it,
    # e.g. a refund the store refused) and whose row is a well-formed order.
    row = _looked_up([last], order_id) if order_id and last.get("role") == "tool" else None
    if (
        row is None
        or not task.hidden.get("graded")
        or "issue_refund" in done_actions(messages, order_id)
        or not isinstance(row.get("price"), int | float)
        or isinstance(row.get("price"), bool)
    ):
        return []
    out = []
    for _ in range(count):
        # Training's day counts whatever the task's split: a copy never shows an age that a
        # validation or test order has.
        status, days, refunded = _case(rng, rng.choice(cases), "train")
        changed = {
            **row,
            "status": "refunded" if refunded else status,
            "delivered_days_ago": days,
            "refunded_amount": row["price"] if refunded else 0.0,
        }
        allowed = refund_allowed(changed)
        variant = [dict(m) for m in messages]
        variant[-1]["content"] = json.dumps(changed)
        expected = _expected_row(changed)
        twin = replace(
            task,
            hidden={**task.hidden, "refund": allowed, "expected": {order_id: expected}, "kind": order_kind(changed)},
        )
        target = turn_target(task=twin, messages=variant)
        reference = turn_reference(task=twin, messages=variant)
        if target is not None and reference is not None:
            out.append({"messages": variant, "target": target, "reference": reference})
    return out
