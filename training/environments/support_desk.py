"""`support-desk`: Acme Store's customer-support desk, the demo's task environment.

The agent has two tools over the store's orders table: `lookup_order(order_id)` and
`issue_refund(order_id, amount?)`. Each task is one customer's message. The store's refund
policy is hidden from the agent (only the grader knows it):

    an order is refunded, in full, only when it was delivered at most 30 days ago
    (not still processing or shipping, not delivered longer ago, not already refunded).

A refund task is graded on the final rows of the episode's copy of the table: the order
the customer asks about must be refunded in full exactly when the policy allows it, and no
other order may change. Tracking questions ("where is my parcel?") have no programmatic
grade — only an operator's comment or a customer's words say whether the answer was good
(`Task.hidden["graded"]` is False, and they carry the demo's seeded feedback).

The store is generated from a seed (`STORE_SEED`): order ids in several formats, items,
customers, prices and delivery ages on both sides of the policy's line, and many request
wordings. Its orders fall into three splits that share no order, id, customer, wording or
day count (`DAY_VALUES`, dealt by a seeded shuffle): `train` (what training traffic may come
from), `validation` (for choosing a recipe and a checkpoint) and `test` (every figure the
project reports). Each task carries its kind (`KINDS`: refundable recent, near the line on
either side, long past, not delivered, already refunded, tracking) in `hidden["kind"]`. `tasks_fresh(seed=…)` generates a slice
anew ("fresh"): other orders, ids, customers and wordings again, added to the same table,
so that a candidate is also measured on cases no training set can have contained.
The same seed gives the same store on every machine.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import replace
from functools import lru_cache
from typing import Any

from training.environments.base import (
    DecisionContext,
    DecisionCurve,
    Environment,
    EpisodeAudit,
    Grade,
    Task,
    ToolError,
    register,
)
from training.environments.policy_rules import Rule, rule_action
from training.environments.records import (
    FieldSpec,
    RecordsState,
    RecordTable,
    call_key,
    key_normalized,
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
                "properties": {"order_id": {"type": "string", "description": "the id the customer gave"}},
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

STORE_SEED = 20261202
SPLITS = ("train", "validation", "test")
SPLIT_ORDERS = {"train": 192, "validation": 32, "test": 64}
FRESH_SPLIT = "fresh"
FRESH_ORDERS = 48
TRACKING_EVERY = 3  # a tracking question about every third order
# What an order id looks like (a regex fragment the agent's harness allows in a tool call).
ORDER_ID_PATTERN = "[A-Z0-9][A-Z0-9-]{2,14}"

_FIRST_NAMES = (
    "Maria James Aiko Omar Priya Lena Tom Chen Sofia Noah Fatima Lucas Emma Ivan Grace Diego Amara Bjorn "
    "Chloe Dmitri Elif Farid Greta Hugo Ines Jonas Kofi Leila Mateo Nadia Oscar Paula Quentin Rosa Samir "
    "Tara Umar Vera Wen Yusuf Zoe Anil Beatriz Carlos Dana Emil Freya Goran Hana Ilya"
).split()
_LAST_NAMES = (
    "Lopez Smith Tanaka Haddad Patel Fischer Baker Wei Rossi Brown Ali Martin Wilson Petrov Kim Silva Okafor "
    "Larsen Dubois Novak Yilmaz Rahimi Berg Laurent Costa Weber Mensah Nasser Ortiz Ivanova Lindqvist Moreau "
    "Garcia Kaur Park Schulz Adeyemi Horvat Santos Keller Murphy Nakamura Reyes Olsen Varga Chowdhury Ferreira "
    "Jansen Kowalski Tran"
).split()
_ITEMS = (
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
    ("running shoes", 89.0),
    ("bath towel", 14.0),
    ("picture frame", 19.5),
    ("kitchen scale", 27.0),
    ("bluetooth speaker", 45.0),
    ("plant pot", 11.0),
    ("rain jacket", 75.0),
    ("chess set", 32.0),
    ("wall clock", 24.0),
    ("cutting board", 21.0),
    ("travel pillow", 17.5),
    ("sunglasses", 38.0),
    ("bike light", 23.0),
    ("cookbook", 26.0),
    ("candle set", 13.0),
    ("laptop stand", 42.0),
    ("puzzle", 18.5),
    ("leather wallet", 55.0),
    ("french press", 31.0),
    ("desk organizer", 16.5),
)


def _id_letter_digits(rng: random.Random) -> str:  # K4821
    return rng.choice(string.ascii_uppercase) + str(rng.randrange(1000, 10000))


def _id_ord(rng: random.Random) -> str:  # ORD-30417
    return f"ORD-{rng.randrange(10000, 100000)}"


def _id_letters_dash(rng: random.Random) -> str:  # MXR-552
    return "".join(rng.choices(string.ascii_uppercase, k=3)) + f"-{rng.randrange(100, 1000)}"


def _id_digits(rng: random.Random) -> str:  # 7043918
    return str(rng.randrange(1_000_000, 10_000_000))


def _id_two_letters(rng: random.Random) -> str:  # BX204518
    return "".join(rng.choices(string.ascii_uppercase, k=2)) + str(rng.randrange(100000, 1000000))


ID_FORMATS = (_id_letter_digits, _id_ord, _id_letters_dash, _id_digits, _id_two_letters)

# Each split has wordings of its own: a request phrased as in training never reaches the test.
_REFUND_ASKS = {
    "train": (
        "Hi, I'm {customer}. The {item} from order {order_id} is not what I expected. Can I get a refund?",
        "Order {order_id}: my {item} broke. Please refund me. - {customer}",
        "Hello, this is {customer}. I would like my money back for order {order_id} (the {item}).",
        "I want to return the {item} I bought. Order number {order_id}. Thanks, {customer}",
        "Can you refund order {order_id}? The {item} arrived damaged. {customer}",
        "{customer} here. Please give me a refund for my {item}, order {order_id}.",
        "Refund request for order {order_id}, a {item}. It doesn't fit my needs. Regards, {customer}",
        "Hey, the {item} (order {order_id}) stopped working. I'd like a refund please. {customer}",
        "Dear support, I am {customer} and I request a refund of order {order_id}.",
        "My order {order_id} was a {item} and I changed my mind. Refund please! - {customer}",
        "Hi there, could I get my money back on {order_id}? It was the {item}. Best, {customer}",
        "This is {customer}: the {item} in order {order_id} is faulty, I want a refund.",
    ),
    "validation": (
        "Good morning, {customer} writing. I'd like to be refunded for order {order_id}, the {item}.",
        "Please process a refund on my order {order_id} ({item}). Thank you, {customer}",
        "Not happy with the {item}. Order {order_id}. Money back? {customer}",
        "I'm {customer}, order {order_id}. The {item} is the wrong color, please refund it.",
    ),
    "test": (
        "Hello! {customer} again. I need a refund for the {item}, order reference {order_id}.",
        "Order #{order_id} - the {item} never worked properly. Can you refund me? {customer}",
        "Hi support, it's {customer}. Requesting my money back for order {order_id}; the {item} was a gift nobody wanted.",
        "The {item} I ordered ({order_id}) is too small. I would like a refund. Cheers, {customer}",
        "Could you please refund order {order_id}? I no longer need the {item}. Kind regards, {customer}",
    ),
    FRESH_SPLIT: (
        "Hi, {customer} speaking. Is it possible to get a refund on order {order_id}? The {item} disappointed me.",
        "{customer}: order {order_id} ({item}) - please send my money back.",
        "Hello team, the {item} from my order {order_id} has a defect. I'd like a full refund. {customer}",
        "Refund for {order_id}, please. I returned the {item} already. Thanks! {customer}",
        "Hi, I bought a {item}, order {order_id}, and I want to get refunded. Sincerely, {customer}",
    ),
}
_TRACKING_ASKS = {
    "train": (
        "Hi, I'm {customer}. Where is my order {order_id}? When will the {item} arrive?",
        "Any news on order {order_id}? I'm waiting for my {item}. {customer}",
        "Hello, {customer} here. What is the status of order {order_id}?",
    ),
    "validation": ("Has my {item} (order {order_id}) shipped yet? - {customer}",),
    "test": (
        "Hi, it's {customer}. Can you tell me where order {order_id} is right now?",
        "When should I expect the {item} from order {order_id}? {customer}",
    ),
    FRESH_SPLIT: (
        "Hello, {customer} asking: has order {order_id} left the warehouse?",
        "Tracking question for order {order_id} (the {item}). Thanks, {customer}",
    ),
}
# What people say about tracking answers (seeded by the demo agent on those tasks).
_OPERATOR_COMMENTS = [
    "Look the order up and tell the customer its status. Do not offer a refund for an order that is still on its way.",
    "The reply should say whether the order has shipped, in one sentence, without making up a date.",
]
_CUSTOMER_FEEDBACK = [
    "You did not tell me where my parcel is.",
    "I only wanted to know the status of my order.",
]


CURVE_MAX_DAYS = 60  # the decision curve's days since delivery: 0 to this
CURVE_REFUNDED_DAYS = 10

# The kinds of task, by what the hidden policy says about the order (one place: the
# evaluation's per-kind figures, tour-demo and the experiment scripts read their labels here).
KINDS: dict[str, str] = {
    "refundable_recent": f"delivered at most {REFUND_WINDOW_DAYS - 9} days ago (refund)",
    "refundable_near_line": f"delivered {REFUND_WINDOW_DAYS - 8}-{REFUND_WINDOW_DAYS} days ago (refund)",
    "late_near_line": f"delivered {REFUND_WINDOW_DAYS + 1}-{REFUND_WINDOW_DAYS + 10} days ago (refuse)",
    "long_past": f"delivered over {REFUND_WINDOW_DAYS + 10} days ago (refuse)",
    "not_delivered": "shipped or still processing (refuse)",
    "already_refunded": "already refunded (refuse)",
    "tracking": "tracking question (people's feedback only, no grade)",
}


def order_kind(row: dict[str, Any]) -> str:
    """The refund-request kind of an order row (see `KINDS`)."""
    days = row.get("delivered_days_ago")
    if row.get("status") == "refunded":
        return "already_refunded"
    if row.get("status") != "delivered" or days is None:
        return "not_delivered"
    if days <= REFUND_WINDOW_DAYS - 9:
        return "refundable_recent"
    if days <= REFUND_WINDOW_DAYS:
        return "refundable_near_line"
    if days <= REFUND_WINDOW_DAYS + 10:
        return "late_near_line"
    return "long_past"


# Day counts are dealt to the splits, so every validation, test and fresh order was
# delivered a number of days ago that no training order shows: the 30-day rule has to be
# read off the number, not matched. The values of each stretch of days (the cases' ranges,
# the first week apart) are shuffled with a fixed seed, evens and odds each on their own,
# and dealt in turn to train, validation, test, train: every split gets both parities and
# small values in every stretch, train about half, and no value is in two splits. Fresh
# slices draw from the test split's values.
DAY_SEED = 20261206
DAY_STRETCHES = (
    (0, 7),
    (8, REFUND_WINDOW_DAYS - 9),
    (REFUND_WINDOW_DAYS - 8, REFUND_WINDOW_DAYS),
    (REFUND_WINDOW_DAYS + 1, REFUND_WINDOW_DAYS + 10),
    (REFUND_WINDOW_DAYS + 11, 60),
    (61, 180),
)
_DEAL_ORDER = ("train", "validation", "test", "train")


def days_dealt(seed: int = DAY_SEED) -> dict[str, tuple[int, ...]]:
    """Each split's day counts (sorted), dealt from a shuffle seeded by `seed`."""
    rng = random.Random(f"days-{seed}")
    dealt: dict[str, list[int]] = {split: [] for split in SPLITS}
    for low, high in DAY_STRETCHES:
        for parity in (0, 1):
            values = [d for d in range(low, high + 1) if d % 2 == parity]
            rng.shuffle(values)
            for turn, value in enumerate(values):
                dealt[_DEAL_ORDER[turn % len(_DEAL_ORDER)]].append(value)
    return {split: tuple(sorted(values)) for split, values in dealt.items()}


DAY_VALUES: dict[str, tuple[int, ...]] = days_dealt()
DAY_VALUES[FRESH_SPLIT] = DAY_VALUES["test"]


def _days(rng: random.Random, low: int, high: int, split: str) -> int:
    return rng.choice([d for d in DAY_VALUES[split] if low <= d <= high])


def _case(rng: random.Random, kind: int, split: str) -> tuple[str, int | None, bool]:
    """(status, days since delivery, already refunded) for the `kind`-th case of eight:
    four refundable (one of them close to the line), four not (two of those just past it
    or long past it, one shipping, one processing or already refunded); the days drawn
    from `split`'s own day counts (`DAY_VALUES`)."""
    if kind in (0, 1, 2):
        return "delivered", _days(rng, 0, REFUND_WINDOW_DAYS - 9, split), False
    if kind == 3:
        return "delivered", _days(rng, REFUND_WINDOW_DAYS - 8, REFUND_WINDOW_DAYS, split), False
    if kind == 4:
        return "delivered", _days(rng, REFUND_WINDOW_DAYS + 1, REFUND_WINDOW_DAYS + 10, split), False
    if kind == 5:
        return "delivered", _days(rng, REFUND_WINDOW_DAYS + 11, 180, split), False
    if kind == 6:
        return "shipped", None, False
    if rng.random() < 0.5:
        return "processing", None, False
    return "delivered", _days(rng, 1, 60, split), True


def _orders(rng: random.Random, count: int, ids: set[str], names: list[str], split: str) -> list[dict[str, Any]]:
    """`count` new orders of `split` whose ids are not in `ids` (added to it), for
    customers popped from `names`; every id format and every case in turn, then shuffled."""
    rows = []
    for i in range(count):
        make_id = ID_FORMATS[i % len(ID_FORMATS)]
        order_id = make_id(rng)
        while order_id in ids:
            order_id = make_id(rng)
        ids.add(order_id)
        item, base_price = rng.choice(_ITEMS)
        price = round(base_price * rng.choice((0.8, 0.9, 1.0, 1.0, 1.1, 1.25)), 2)
        status, days, refunded = _case(rng, i % 8, split)
        rows.append(
            {
                "order_id": order_id,
                "customer": names.pop(),
                "item": item,
                "price": price,
                "status": "refunded" if refunded else status,
                "delivered_days_ago": days,
                "refunded_amount": price if refunded else 0.0,
            }
        )
    rng.shuffle(rows)
    return rows


def _all_names(seed: int) -> list[str]:
    names = [f"{first} {last}" for first in _FIRST_NAMES for last in _LAST_NAMES]
    random.Random(f"names-{seed}").shuffle(names)
    return names


def _table(rows: list[dict[str, Any]]) -> RecordTable:
    return RecordTable(
        name="order",
        key="order_id",
        rows=tuple(rows),
        writable={
            "status": FieldSpec(types=(str,), choices=("refunded",)),
            "refunded_amount": FieldSpec(types=(int, float), minimum=0.01),
        },
    )


@lru_cache(maxsize=4)
def store_orders(seed: int = STORE_SEED) -> dict[str, tuple[dict[str, Any], ...]]:
    """The store's orders by split, generated from `seed`: no id or customer in two splits."""
    rng = random.Random(f"store-{seed}")
    ids: set[str] = set()
    names = _all_names(seed)
    return {split: tuple(_orders(rng, SPLIT_ORDERS[split], ids, names, split)) for split in SPLITS}


def orders_table(seed: int = STORE_SEED) -> RecordTable:
    """The store's orders table (every split), the same on every machine for one seed."""
    return _table([row for split in SPLITS for row in store_orders(seed)[split]])


@lru_cache(maxsize=16)
def fresh_orders(*, seed: int, store_seed: int = STORE_SEED) -> tuple[dict[str, Any], ...]:
    """A slice of `FRESH_ORDERS` orders generated from `seed`, with ids and customers the
    store (`store_seed`) does not have."""
    store = store_orders(store_seed)
    ids = {row["order_id"] for rows in store.values() for row in rows}
    used = {row["customer"] for rows in store.values() for row in rows}
    names = [n for n in _all_names(store_seed) if n not in used]
    random.Random(f"fresh-names-{seed}").shuffle(names)
    return tuple(_orders(random.Random(f"fresh-{store_seed}-{seed}"), FRESH_ORDERS, ids, names, FRESH_SPLIT))


@lru_cache(maxsize=16)
def _fresh_table(seed: int, store_seed: int) -> RecordTable:
    rows = [row for split in SPLITS for row in store_orders(store_seed)[split]]
    return _table(rows + list(fresh_orders(seed=seed, store_seed=store_seed)))


def refund_allowed(row: dict[str, Any]) -> bool:
    """The hidden policy."""
    days = row.get("delivered_days_ago")
    return row.get("status") == "delivered" and days is not None and days <= REFUND_WINDOW_DAYS


def _expected_row(row: dict[str, Any]) -> dict[str, Any]:
    """The fields of `row` the grade checks once the policy has been applied to it."""
    if refund_allowed(row):
        return {"status": "refunded", "refunded_amount": row["price"]}
    return {"status": row["status"], "refunded_amount": row["refunded_amount"]}


def _tasks(rows: tuple[dict[str, Any], ...], split: str, seed: int, extra: dict[str, Any] | None = None) -> list[Task]:
    rng = random.Random(f"wording-{seed}-{split}")
    refund_asks, tracking_asks = _REFUND_ASKS[split], _TRACKING_ASKS[split]
    tasks = []
    for i, row in enumerate(rows):
        fields = {"customer": row["customer"], "item": row["item"], "order_id": row["order_id"]}
        allowed = refund_allowed(dict(row))
        expected = _expected_row(row)
        wording = rng.randrange(len(refund_asks))
        tasks.append(
            Task(
                id=f"refund-{row['order_id']}",
                prompt=refund_asks[wording].format(**fields),
                tools=TOOLS,
                system=SYSTEM_PROMPT,
                split=split,
                hidden={
                    "graded": True,
                    "order_id": row["order_id"],
                    "refund": allowed,
                    "expected": {row["order_id"]: expected},
                    "kind": order_kind(dict(row)),
                    "wording": f"{split}-refund-{wording}",
                    **(extra or {}),
                },
            )
        )
        if i % TRACKING_EVERY == 1:  # a tracking question: people's feedback only, no grade
            wording = rng.randrange(len(tracking_asks))
            tasks.append(
                Task(
                    id=f"track-{row['order_id']}",
                    prompt=tracking_asks[wording].format(**fields),
                    tools=TOOLS,
                    system=SYSTEM_PROMPT,
                    split=split,
                    hidden={
                        "graded": False,
                        "order_id": row["order_id"],
                        "concerns": [row["order_id"]],
                        "kind": "tracking",
                        "operator_comment": _OPERATOR_COMMENTS[i % len(_OPERATOR_COMMENTS)],
                        "customer_feedback": _CUSTOMER_FEEDBACK[i % len(_CUSTOMER_FEEDBACK)],
                        "wording": f"{split}-track-{wording}",
                        **(extra or {}),
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

    kinds = KINDS

    def __init__(self, max_calls: int = 6, store_seed: int = STORE_SEED) -> None:
        self.store_seed = store_seed
        self.table = orders_table(store_seed)
        self.max_calls = max_calls
        orders = store_orders(store_seed)
        self._tasks = [task for split in SPLITS for task in _tasks(orders[split], split, store_seed)]

    def tasks(self) -> list[Task]:
        return list(self._tasks)

    def tasks_for(self, *, split: str, graded: bool | None = None) -> list[Task]:
        return [
            t for t in self._tasks if t.split == split and (graded is None or bool(t.hidden.get("graded")) == graded)
        ]

    def tasks_fresh(self, *, seed: int) -> list[Task]:
        """A freshly generated slice (split "fresh"): `FRESH_ORDERS` orders with ids,
        customers and request wordings the store's splits do not have, added to the table
        of its episodes beside every order of the store."""
        rows = fresh_orders(seed=seed, store_seed=self.store_seed)
        return _tasks(rows, FRESH_SPLIT, self.store_seed * 1_000 + seed, extra={"fresh_seed": seed})

    @staticmethod
    def graded(task: Task) -> bool:
        return bool(task.hidden.get("graded"))

    def reset(self, task: Task) -> RecordsState:
        fresh_seed = task.hidden.get("fresh_seed")
        table = self.table if fresh_seed is None else _fresh_table(fresh_seed, self.store_seed)
        return records_state_new(table=table, max_calls=self.max_calls, task=task)

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
            try:
                amount = refund_amount(arguments.get("amount", row["price"]))
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

    def decision_curve(self) -> DecisionCurve:
        """P(refund) after a lookup by days since delivery, 0 to 60: the policy is a step
        down after `REFUND_WINDOW_DAYS`; shipped, processing and refunded orders beside it."""
        return DecisionCurve(
            x_label="days since delivery",
            action="issue_refund",
            threshold=REFUND_WINDOW_DAYS,
            xs=tuple(range(CURVE_MAX_DAYS + 1)),
            status="delivered",
            statuses=("shipped", "processing", "refunded"),
        )

    def decision_contexts(self, *, tasks: list[Task], per_point: int, every: int = 1) -> list[DecisionContext]:
        """For each point, `per_point` of `tasks`' refund requests in turn (other customers,
        ids and wordings from point to point), each followed by the lookup of the customer's
        order showing the point's status and age (a refunded order: refunded
        `CURVE_REFUNDED_DAYS` days after delivery, inside the window)."""
        requests = [t for t in tasks if t.hidden.get("graded") and t.hidden.get("order_id")]
        if not requests or per_point < 1:
            return []
        curve = self.decision_curve()
        edge = (curve.threshold, curve.threshold + 1)
        xs = [x for i, x in enumerate(curve.xs) if i % max(1, every) == 0 or x in edge]
        points: list[tuple[str, int | None]] = [(curve.status, x) for x in xs]
        points += [(status, CURVE_REFUNDED_DAYS if status == "refunded" else None) for status in curve.statuses]
        out = []
        turn = 0
        for status, days in points:
            for _ in range(per_point):
                task = requests[turn % len(requests)]
                turn += 1
                fresh_seed = task.hidden.get("fresh_seed")
                table = self.table if fresh_seed is None else _fresh_table(fresh_seed, self.store_seed)
                row = table.row(task.hidden["order_id"])
                shown = {
                    **row,
                    "status": status,
                    "delivered_days_ago": days,
                    "refunded_amount": row["price"] if status == "refunded" else 0.0,
                }
                messages = [*task.first_messages(), *lookup_messages(row["order_id"], shown)]
                out.append(
                    DecisionContext(
                        status=status, x=days, messages=messages, tools=task.tools, acts=refund_allowed(shown)
                    )
                )
        return out

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


def lookup_messages(order_id: str, row: dict[str, Any], call_id: str = "call_0") -> list[dict[str, Any]]:
    """The assistant's lookup of `order_id` and the tool's answer showing `row`, as an
    episode logs them."""
    arguments = json.dumps({"order_id": order_id})
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "lookup_order", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "name": "lookup_order", "content": json.dumps(row)},
    ]


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


def _looked_up(messages: list[dict[str, Any]], order_id: str) -> dict[str, Any] | None:
    """The row the conversation's last successful lookup of `order_id` returned."""
    found = None
    for m in messages:
        if m.get("role") != "tool":
            continue
        try:
            row = json.loads(str(m.get("content") or ""))
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("order_id") == order_id:
            found = row
    return found


def refund_amount(value: Any) -> Any:
    """A refund's `amount` argument as the tool reads it: a string such as "$12.50" becomes
    its number (ValueError when it is none); any other value is returned as it is."""
    return float(value.strip().lstrip("$")) if isinstance(value, str) else value


def done_actions(messages: list[dict[str, Any]], order_id: str) -> set[str]:
    """The tools called on `order_id` in `messages` whose result was not an error. The id
    is read as the tools read it (trimmed, any case): a lookup of "jl221861" found the order.
    A result answers a call of the assistant message just before it, the first one not yet
    answered with its id: call ids repeat from turn to turn (a served turn's first call is
    `call_0` every time) and may repeat within one."""
    wanted = key_normalized(order_id)
    waiting: list[tuple[str, str | None]] = []  # (call id, tool name if it names the order)
    done: set[str] = set()
    for m in messages:
        role = m.get("role")
        if role == "assistant":
            waiting = []
            calls = m.get("tool_calls")
            for call in calls if isinstance(calls, list) else []:
                call_id = str(call.get("id", "")) if isinstance(call, dict) else ""
                value = call_key(call, "order_id")
                function = call.get("function") if isinstance(call, dict) else None
                name = function.get("name") if isinstance(function, dict) else None
                on_order = value is not None and key_normalized(value) == wanted and isinstance(name, str)
                waiting.append((call_id, name if on_order else None))
        elif role == "tool":
            call_id = str(m.get("tool_call_id", ""))
            match = next((i for i, (cid, _) in enumerate(waiting) if cid == call_id), None)
            if match is None:
                continue
            name = waiting.pop(match)[1]
            text = _tool_text(m.get("content"))
            if name and text is not None and not text.startswith("error"):
                done.add(name)
    return done


def _tool_text(content: Any) -> str | None:
    """A logged tool result's text (a string, or the text parts of a content list)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "".join(parts) if parts else None
    return None


def tasks_sample(
    *, split: str, count: int, seed: int = 0, graded_share: float = 1.0, fresh_seed: int | None = None
) -> list[Task]:
    """`count` tasks of `split` ("train", "validation", "test", or "fresh" with the slice's
    `fresh_seed`), graded ones with probability `graded_share`, reproducibly. Each pool is
    dealt like a shuffled deck (reshuffled when used up), so a run of `k * len(pool)` graded
    tasks covers every task `k` times."""
    desk = SupportDesk()
    if split == FRESH_SPLIT:
        if fresh_seed is None:
            raise ValueError("a fresh slice needs its fresh_seed")
        tasks = desk.tasks_fresh(seed=fresh_seed)
    elif split in SPLITS:
        tasks = desk.tasks_for(split=split)
    else:
        raise ValueError(f"split must be one of {', '.join((*SPLITS, FRESH_SPLIT))}, not {split!r}")
    rng = random.Random(seed)
    pools = {graded: [t for t in tasks if bool(t.hidden.get("graded")) == graded] for graded in (True, False)}
    decks: dict[bool, list[Task]] = {True: [], False: []}
    out = []
    for _ in range(count):
        graded = not pools[False] or rng.random() < graded_share
        if not decks[graded]:
            decks[graded] = rng.sample(pools[graded], len(pools[graded]))
        out.append(decks[graded].pop())
    return out


# The names a policy note may use for the lookup's fields, besides the row's own.
FIELD_ALIASES = {"days_since_delivery": "delivered_days_ago"}
REFUND_ACTIONS = frozenset({"refund", "issue_refund"})


def decision_fields(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields a decision point shows: the row the conversation's last lookup returned
    (`status`, `delivered_days_ago`, `price`, …), also under `FIELD_ALIASES`' names."""
    row: dict[str, Any] = {}
    for m in messages:
        if m.get("role") != "tool":
            continue
        try:
            found = json.loads(str(m.get("content") or ""))
        except ValueError:
            continue
        if isinstance(found, dict):
            row = found
    fields = dict(row)
    for alias, name in FIELD_ALIASES.items():
        if name in row:
            fields.setdefault(alias, row[name])
    return fields


def policy_note_label(rule: Rule, context: DecisionContext) -> bool | None:
    """Whether an approved policy note's `rule` asks for a refund at `context`: True for a
    refund (`refund` or `issue_refund`), False for any other action, None where the rule
    does not cover the case."""
    action = rule_action(rule, decision_fields(context.messages))
    if action is None:
        return None
    return action.strip().casefold() in REFUND_ACTIONS
