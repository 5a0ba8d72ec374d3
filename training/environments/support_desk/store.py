"""The store behind the support desk: its orders, generated from a seed and dealt to splits
that share no order, id, customer, wording or day count, the hidden refund policy, and the
customer requests (tasks) made from them."""

from __future__ import annotations

import random
import string
from functools import lru_cache
from typing import Any

from training.environments.base import (
    Task,
)
from training.environments.records import (
    FieldSpec,
    RecordTable,
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
    from `split`'s own day counts (`DAY_VALUES`). Kind 8 is for counterfactual copies only
    (a store's orders cycle through the first eight): delivered 41-60 days ago, the ages
    that kind 5 shows seldom, its range being mostly past two months. Kinds 9 and 10 are
    for copies too: delivered 0-30 days ago (refundable) and 31-60 (late), each age of the
    split's stretch as likely as any other. Kind 11, for copies too: delivered 100-180 days
    ago, a three-digit age that begins with 1, as the teens do."""
    if kind == 11:
        return "delivered", _days(rng, 100, 180, split), False
    if kind == 8:
        return "delivered", _days(rng, REFUND_WINDOW_DAYS + 11, 60, split), False
    if kind == 9:
        return "delivered", _days(rng, 0, REFUND_WINDOW_DAYS, split), False
    if kind == 10:
        return "delivered", _days(rng, REFUND_WINDOW_DAYS + 1, 60, split), False
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
