"""The `support-desk` environment: tasks by split, the tools over the orders table, the grade,
the decision curve."""

from __future__ import annotations

import json
import random
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
from training.environments.records import (
    RecordsState,
    records_audit,
    records_grade,
    records_lookup,
    records_row,
    records_state_new,
    records_update,
)
from training.environments.support_desk.store import (
    CURVE_MAX_DAYS,
    CURVE_REFUNDED_DAYS,
    FRESH_SPLIT,
    KINDS,
    REFUND_WINDOW_DAYS,
    SPLITS,
    STORE_SEED,
    _fresh_table,
    _tasks,
    fresh_orders,
    orders_table,
    refund_allowed,
    store_orders,
)
from training.environments.support_desk.transcripts import lookup_messages, refund_amount


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
