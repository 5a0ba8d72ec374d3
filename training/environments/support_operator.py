"""A simulated support lead for the support desk: what a person who knows the refund policy
writes, in words only, about an episode that went wrong.

It reads the conversation the way a reviewer reads a trace: it finds the first assistant
turn the policy would not have taken and says why, over the order the customer named and
the row the store holds for it. It never writes a tool call, a tool's name or an action
label, only sentences. Like a real lead it is sometimes vague ("check the policy") and now
and then wrong (it states the opposite of the policy), at rates the caller sets.

The comments are **simulated**: the caller files them under an account that says so, and
every figure learnt from them is labelled as coming from a scripted reviewer who knows the
hidden policy — closer to a person than an oracle label (words, vague, sometimes wrong),
but not a person. Django-free: the demo's comment service and experiments both call it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from training.environments.base import Task
from training.environments.records import call_arguments, call_key, key_normalized, records_row
from training.environments.support_desk import REFUND_WINDOW_DAYS, SupportDesk, turn_reference
from training.environments.support_desk.transcripts import done_actions, refund_amount

VAGUE_RATE = 0.2
WRONG_RATE = 0.1

# {id}: the order the customer named; {days}, {ago}: since delivery; {status}; {other}: an
# order the turn worked on instead; {window}: the refund window in days.
_REFUND_DUE = [
    "{id} was delivered {days} days ago, well inside our {window}-day window. We refund those in full.",
    "Delivered {days} days ago is within the {window} days, so this customer gets their money back. Refund it.",
    "We should have refunded {id}: it arrived {days} days ago and anything under {window} days is refundable.",
]
_TOO_LATE = [
    "This one was delivered {ago}; we don't refund after {window} days, say so politely.",
    "{id} arrived {days} days ago, past our {window}-day window. No refund, just a kind explanation.",
    "Over {window} days since delivery ({days}), so we can't refund {id}. Tell the customer why.",
]
_NOT_DELIVERED = [
    "{id} is still {status}, it hasn't reached the customer. Nothing gets refunded before delivery; tell them it's on its way.",
    "The order hasn't been delivered yet ({status}), so a refund is premature. Explain that to the customer.",
]
_ALREADY_REFUNDED = [
    "{id} was already refunded. Tell the customer so, we never pay twice.",
    "Their money for {id} went back already; just confirm the earlier refund.",
]
_FULL_PRICE = [  # a refund of another sum than the order's price
    "{id} qualifies for a full refund: the customer gets back exactly what they paid, not another sum.",
    "Inside {window} days {id} is refunded in full, the whole price and nothing else.",
]
_OTHER_ORDER = [
    "The customer asked about {id}, but this worked on {other}. Always work on the order the customer names.",
    "Wrong order: they wrote {id}, not {other}. Read the id from their message.",
]
_NO_LOOKUP = [
    "Look at the order first: we answer refund requests only after checking {id} in the system.",
    "This answered without checking {id}. Check the order before deciding anything.",
]
_REFUND_ANYWAY = [  # a wrong comment on an order not delivered yet or already refunded
    "That one qualifies, refund {id} in full.",
]
_TELL = [
    "The refund for {id} went through; now tell the customer so, in a sentence.",
]
_VAGUE = [
    "Not how we handle these. Check the refund policy.",
    "This isn't right, have another look at the order before answering.",
    "Please re-read our refund rules for cases like this one.",
]


@dataclass(frozen=True)
class SimulatedComment:
    body: str
    message_index: int  # the assistant turn in `messages` the comment is about
    kind: str  # "specific", "vague" or "wrong" (states the opposite of the policy)
    mistake: str  # what the turn did: "other_order", "no_lookup", "refused", "amount", "refunded", "answer"


def _action(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-format assistant message's first action: a tool call (its name and the
    order it names, read as the tools read it) or a reply. Logged content is untrusted:
    the calls may have any shape."""
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else ""
        order = call_key(call, "order_id")
        arguments = call_arguments(call) or {}
        return {
            "tool": str(name or ""),
            "order_id": "" if order is None else key_normalized(order),
            # Any value the model wrote, a float or junk alike: `_full` judges it.
            **({"amount": arguments["amount"]} if "amount" in arguments else {}),
        }
    return {"reply": True}


def _full(amount: Any, price: Any) -> bool:
    """Whether a refund's `amount` argument is exactly the order's price, as the tool reads
    it (`refund_amount`): the grade wants the whole price back, no less."""
    try:
        amount = refund_amount(amount)
    except ValueError:
        return False
    if isinstance(amount, bool) or not isinstance(amount, int | float):
        return False
    if isinstance(price, bool) or not isinstance(price, int | float):
        return False
    try:
        return float(amount) == float(price)
    except OverflowError:  # an integer past a float's range
        return False


def _accepts(accepted: list[dict[str, Any]], action: dict[str, Any], price: Any = None) -> bool:
    """Whether the policy's accepted actions include `action`, by tool and order, with the
    id read in any case as the tools read it. A refund must be in full: an `amount` below
    the price leaves the order short, which the grade counts as a failure."""
    for a in accepted:
        if "reply" in a and "reply" in action:
            return True
        if (
            "tool" in a
            and a["tool"] == action.get("tool")
            and key_normalized(a["arguments"]["order_id"]) == action.get("order_id")
            and (a["tool"] != "issue_refund" or "amount" not in action or _full(action["amount"], price))
        ):
            return True
    return False


def _first_wrong_turn(
    task: Task, messages: list[dict[str, Any]], price: Any = None
) -> tuple[int, dict[str, Any], list] | None:
    """The index of the first assistant turn whose action the policy does not accept, with
    that action and the accepted ones (`price`: the order's, to judge a refund's amount)."""
    # The turns after the customer's message: a stored trace may lack the system prompt or
    # the worked example, so count from the last user message, not from the task's opening.
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    start = users[-1] + 1 if users else len(task.first_messages())
    for index, message in enumerate(messages[start:], start):
        if message.get("role") != "assistant":
            continue
        accepted = json.loads(turn_reference(task=task, messages=messages[:index]) or "[]")
        action = _action(message)
        if not _accepts(accepted, action, price):
            return index, action, accepted
    return None


def operator_comment(
    *,
    task: Task,
    messages: list[dict[str, Any]],
    rng: random.Random,
    vague_rate: float = VAGUE_RATE,
    wrong_rate: float = WRONG_RATE,
    env: SupportDesk | None = None,
) -> SimulatedComment | None:
    """What the simulated lead writes about `messages` (an episode of `task` in the OpenAI
    format), or None when the task has no grade or every assistant turn was one the policy
    accepts. `rng` picks the phrasing and whether this comment is vague or wrong."""
    if not task.hidden.get("graded"):
        return None
    env = env or SupportDesk()
    order_id = task.hidden["order_id"]
    state = env.reset(task)
    row = records_row(state=state, key=order_id)
    found = _first_wrong_turn(task, messages, row.get("price"))
    if found is None:
        return None
    index, action, _accepted = found
    days = row.get("delivered_days_ago")
    fields = {
        "id": order_id,
        "days": days,
        # "4 weeks" would read as inside a 30-day window: weeks only well past it.
        "ago": f"{round(days / 7)} weeks ago" if isinstance(days, int) and days >= 42 else f"{days} days ago",
        "status": row.get("status"),
        "window": REFUND_WINDOW_DAYS,
        "other": action.get("order_id", ""),
    }
    # Only what went through on the customer's own order: a lookup that errored is no lookup.
    done = done_actions(messages[:index], order_id)
    if action.get("order_id") and action["order_id"] != key_normalized(order_id):
        mistake, templates = "other_order", _OTHER_ORDER
    elif "issue_refund" in done:
        mistake, templates = "answer", _TELL
    elif "reply" in action and "lookup_order" not in done:
        mistake, templates = "no_lookup", _NO_LOOKUP
    elif (
        task.hidden["refund"]
        and action.get("tool") == "issue_refund"
        and action.get("order_id") == key_normalized(order_id)
        and "amount" in action
    ):
        mistake, templates = "amount", _FULL_PRICE
    elif task.hidden["refund"]:
        mistake, templates = "refused", _REFUND_DUE
    else:
        mistake = "refunded" if action.get("tool") == "issue_refund" else "answer"
        templates = _policy_templates(row)
    draw = rng.random()
    if draw < wrong_rate:
        if mistake in ("refused", "refunded", "answer") and templates is not _TELL:
            # A lead who misread the record: the opposite of what the policy says.
            wrong = _TOO_LATE if task.hidden["refund"] else (_REFUND_DUE if isinstance(days, int) else _REFUND_ANYWAY)
            return SimulatedComment(_render(rng, wrong, fields), index, "wrong", mistake)
    elif draw < wrong_rate + vague_rate:
        return SimulatedComment(rng.choice(_VAGUE), index, "vague", mistake)
    return SimulatedComment(_render(rng, templates, fields), index, "specific", mistake)


def _policy_templates(row: dict[str, Any]) -> list[str]:
    if row.get("status") == "refunded":
        return _ALREADY_REFUNDED
    if row.get("status") != "delivered":
        return _NOT_DELIVERED
    return _TOO_LATE


def _render(rng: random.Random, templates: list[str], fields: dict[str, Any]) -> str:
    text = rng.choice(templates).format(**fields)
    return text[0].upper() + text[1:]
