"""`support-desk`: Acme Store's customer-support desk, the demo's task environment.

The agent has two tools over a small orders table: `lookup_order(order_id)` and
`issue_refund(order_id, amount?)`. Each task is one customer's message. The store's refund
policy is hidden from the agent (only the grader knows it):

    an order is refunded, in full, only when it was delivered at most 30 days ago
    (not still processing or shipping, not delivered longer ago, not already refunded).

A refund task is graded on the final rows of the episode's copy of the table: the order
the customer asks about must be refunded in full exactly when the policy allows it, and no
other order may change. Tracking questions ("where is my parcel?") have no programmatic
grade — only an operator's comment or a customer's words say whether the answer was good
(`Task.hidden["graded"]` is False, and they carry the demo's seeded feedback).

Tasks are a pure function of the code: the same ids, prompts and splits on every machine.
One order in four (rotating over the order kinds) is held out (`split="heldout"`), never used for training.
"""

from __future__ import annotations

import json
import random
from typing import Any

from training.environments.base import Environment, EpisodeAudit, Grade, Task, ToolError, register
from training.environments.records import (
    FieldSpec,
    RecordsState,
    RecordTable,
    records_audit,
    records_grade,
    records_lookup,
    records_row,
    records_state_new,
    records_update,
)

REFUND_WINDOW_DAYS = 30
SYSTEM_PROMPT = (
    "You are the customer-support agent of Acme Store. Use the tools to look up orders and to "
    "issue refunds. Reply to the customer in one or two short sentences."
)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Look up an order by its id: item, price, status, days since delivery.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string", "description": "e.g. A1001"}},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "issue_refund",
            "description": "Refund an order. The amount defaults to the order's full price.",
            "parameters": {
                "type": "object",
                "properties": {
                    "order_id": {"type": "string"},
                    "amount": {"type": "number", "description": "in dollars; omit for a full refund"},
                },
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    },
]

_CUSTOMERS = (
    "Maria Lopez, James Smith, Aiko Tanaka, Omar Haddad, Priya Patel, Lena Fischer, Tom Baker, "
    "Chen Wei, Sofia Rossi, Noah Brown, Fatima Ali, Lucas Martin, Emma Wilson, Ivan Petrov, "
    "Grace Kim, Diego Silva"
).split(", ")
_ITEMS = [
    ("coffee mug", 12.5),
    ("desk lamp", 34.0),
    ("wool scarf", 25.0),
    ("phone case", 15.0),
    ("water bottle", 18.0),
    ("backpack", 49.0),
    ("notebook set", 9.5),
    ("headphones", 59.0),
    ("yoga mat", 29.0),
    ("teapot", 22.0),
    ("umbrella", 16.0),
    ("board game", 39.0),
]
# (status, days since delivery or None), cycled over the orders: half are refundable.
_CASES = [
    ("delivered", 3),
    ("shipped", None),
    ("delivered", 12),
    ("delivered", 45),
    ("delivered", 7),
    ("processing", None),
    ("delivered", 21),
    ("delivered", 60),
]
_REFUND_ASKS = [
    "Hi, I'm {customer}. The {item} from order {order_id} is not what I expected. Can I get a refund?",
    "Order {order_id}: my {item} broke. Please refund me. - {customer}",
    "Hello, this is {customer}. I would like my money back for order {order_id} (the {item}).",
]
_TRACKING_ASKS = [
    "Hi, I'm {customer}. Where is my order {order_id}? When will the {item} arrive?",
]
# What people say about tracking answers (seeded by the demo agent on those tasks).
_OPERATOR_COMMENTS = [
    "Look the order up and tell the customer its status. Do not offer a refund for an order that is still on its way.",
    "The reply should say whether the order has shipped, in one sentence, without making up a date.",
]
_CUSTOMER_FEEDBACK = [
    "You did not tell me where my parcel is.",
    "I only wanted to know the status of my order.",
]

N_ORDERS = 48
HELDOUT_EVERY = 4


def orders_table() -> RecordTable:
    """The store's orders, the same on every machine."""
    rows = []
    for i in range(N_ORDERS):
        item, price = _ITEMS[(i * 5) % len(_ITEMS)]
        status, days = _CASES[i % len(_CASES)]
        rows.append(
            {
                "order_id": f"A{1001 + i}",
                "customer": _CUSTOMERS[i % len(_CUSTOMERS)],
                "item": item,
                "price": price,
                "status": status,
                "delivered_days_ago": days,
                "refunded_amount": 0.0,
            }
        )
    return RecordTable(
        name="order",
        key="order_id",
        rows=tuple(rows),
        writable={
            "status": FieldSpec(types=(str,), choices=("refunded",)),
            "refunded_amount": FieldSpec(types=(int, float), minimum=0.01),
        },
    )


def refund_allowed(row: dict[str, Any]) -> bool:
    """The hidden policy."""
    days = row.get("delivered_days_ago")
    return row.get("status") == "delivered" and days is not None and days <= REFUND_WINDOW_DAYS


def _tasks(table: RecordTable) -> list[Task]:
    tasks = []
    for i, row in enumerate(table.rows):
        # One order in four is held out, rotating through the cases so both splits hold each kind.
        split = "heldout" if i % HELDOUT_EVERY == (i // len(_CASES)) % HELDOUT_EVERY else "train"
        fields = {"customer": row["customer"], "item": row["item"], "order_id": row["order_id"]}
        allowed = refund_allowed(dict(row))
        expected = (
            {"status": "refunded", "refunded_amount": row["price"]}
            if allowed
            else {"status": row["status"], "refunded_amount": 0.0}
        )
        tasks.append(
            Task(
                id=f"refund-{row['order_id']}",
                prompt=_REFUND_ASKS[i % len(_REFUND_ASKS)].format(**fields),
                tools=TOOLS,
                system=SYSTEM_PROMPT,
                split=split,
                hidden={
                    "graded": True,
                    "order_id": row["order_id"],
                    "refund": allowed,
                    "expected": {row["order_id"]: expected},
                },
            )
        )
        if i % 3 == 1:  # a tracking question about every third order: qualitative feedback only
            tasks.append(
                Task(
                    id=f"track-{row['order_id']}",
                    prompt=_TRACKING_ASKS[0].format(**fields),
                    tools=TOOLS,
                    system=SYSTEM_PROMPT,
                    split=split,
                    hidden={
                        "graded": False,
                        "order_id": row["order_id"],
                        "concerns": [row["order_id"]],
                        "operator_comment": _OPERATOR_COMMENTS[i % len(_OPERATOR_COMMENTS)],
                        "customer_feedback": _CUSTOMER_FEEDBACK[i % len(_CUSTOMER_FEEDBACK)],
                    },
                )
            )
    return tasks


@register
class SupportDesk(Environment):
    name = "support-desk"
    description = "Acme Store's support desk: look up orders and refund them under a hidden policy."
    max_steps = 4
    max_tokens = 400

    def __init__(self, max_calls: int = 6) -> None:
        self.table = orders_table()
        self.max_calls = max_calls
        self._tasks = _tasks(self.table)

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def tasks_for(self, *, split: str, graded: bool | None = None) -> list[Task]:
        return [
            t for t in self._tasks if t.split == split and (graded is None or bool(t.hidden.get("graded")) == graded)
        ]

    @staticmethod
    def graded(task: Task) -> bool:
        return bool(task.hidden.get("graded"))

    def reset(self, task: Task) -> RecordsState:
        return records_state_new(table=self.table, max_calls=self.max_calls, task=task)

    def call(self, state: RecordsState, name: str, arguments: dict[str, Any]) -> str:
        unknown = set(arguments) - {"order_id", "amount"}
        if unknown:
            raise ToolError(f"unknown argument(s) {', '.join(sorted(unknown))}")
        if "order_id" not in arguments:
            raise ToolError("order_id is required")
        if name == "lookup_order":
            row = records_lookup(state=state, key=arguments["order_id"])
            return json.dumps(row)
        if name == "issue_refund":
            row = records_row(state=state, key=arguments["order_id"])
            if row["status"] == "refunded":
                raise ToolError(f"order {row['order_id']} was already refunded")
            amount = arguments.get("amount", row["price"])
            if isinstance(amount, str):
                try:
                    amount = float(amount.strip().lstrip("$"))
                except ValueError:
                    raise ToolError("amount must be a number") from None
            if isinstance(amount, int | float) and not isinstance(amount, bool) and amount > row["price"]:
                raise ToolError(f"amount must be at most the order's price, {row['price']:.2f}")
            updated = records_update(
                state=state,
                key=row["order_id"],
                values={"status": "refunded", "refunded_amount": amount},
            )
            return json.dumps({"refunded": updated["order_id"], "amount": updated["refunded_amount"]})
        raise ToolError(f"unknown tool {name!r}")

    def audit(self, state: RecordsState, messages: list[dict[str, Any]]) -> EpisodeAudit:
        return records_audit(state=state, messages=messages)

    def grade(self, state: RecordsState, messages: list[dict[str, Any]]) -> Grade:
        """The final rows against the task's hidden expectation. A tracking task has no
        programmatic grade: it gets 0.0 with a reason that says so (see `graded`)."""
        task = state.task
        if task is None or not self.graded(task):
            return Grade(0.0, "not graded: this task only gets people's feedback")
        order_id = task.hidden["order_id"]
        success = (
            f"refunded order {order_id} in full, as the policy allows"
            if task.hidden["refund"]
            else f"did not refund order {order_id}, which the policy does not allow"
        )
        return records_grade(state=state, expected=task.hidden["expected"], success=success)


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
    done = _done_actions(messages, order_id)
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
    tool call, or a sentence to the customer). None for a task without a grade."""
    reference = turn_reference(task=task, messages=messages)
    if reference is None:
        return None
    action = json.loads(reference)[0]
    order_id = task.hidden["order_id"]
    if "tool" in action:
        call = {"name": action["tool"], "arguments": action["arguments"]}
        return f"<tool_call>{json.dumps(call)}</tool_call>"
    if "issue_refund" in _done_actions(messages, order_id):
        return f"Your refund for order {order_id} has been issued in full."
    return f"I am sorry, order {order_id} is not eligible for a refund under our policy."


def _done_actions(messages: list[dict[str, Any]], order_id: str) -> set[str]:
    """The tools called on `order_id` in `messages` whose result was not an error."""
    names = {}
    for m in messages:
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or []:
                function = call.get("function") or {}
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    arguments = {}
                if isinstance(arguments, dict) and arguments.get("order_id") == order_id:
                    names[call.get("id", "")] = function.get("name", "")
    return {
        names[m.get("tool_call_id", "")]
        for m in messages
        if m.get("role") == "tool"
        and m.get("tool_call_id", "") in names
        and not str(m.get("content") or "").startswith("error")
    }


def tasks_sample(*, split: str, count: int, seed: int = 0, graded_share: float = 1.0) -> list[Task]:
    """`count` tasks of `split`, graded ones with probability `graded_share`, reproducibly.
    Each pool is dealt like a shuffled deck (reshuffled when used up), so a run of
    `k * len(pool)` graded tasks covers every task `k` times."""
    desk = SupportDesk()
    rng = random.Random(seed)
    pools = {True: desk.tasks_for(split=split, graded=True), False: desk.tasks_for(split=split, graded=False)}
    decks: dict[bool, list[Task]] = {True: [], False: []}
    out = []
    for _ in range(count):
        graded = not pools[False] or rng.random() < graded_share
        if not decks[graded]:
            decks[graded] = rng.sample(pools[graded], len(pools[graded]))
        out.append(decks[graded].pop())
    return out
