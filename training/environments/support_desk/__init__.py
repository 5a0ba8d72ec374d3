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

The package: `store` (the orders, the policy, the requests), `environment` (the tools and the
grade), `oracle` (the policy's own turns, as labels), `policy_notes` (a decision point labelled
by an approved note) and `transcripts` (reading an episode's messages). Importing it registers
the environment; the names below are the ones the demo, the experiment scripts and the other
packages use.
"""

from training.environments.support_desk.environment import SupportDesk, tasks_sample
from training.environments.support_desk.oracle import (
    NEAR_LINE_CASES,
    counterfactual_turns,
    oracle_turns,
    turn_reference,
    turn_target,
)
from training.environments.support_desk.policy_notes import decision_fields, policy_note_label
from training.environments.support_desk.store import (
    FRESH_SPLIT,
    KINDS,
    ORDER_ID_PATTERN,
    REFUND_WINDOW_DAYS,
    SPLITS,
    TOOLS,
)

__all__ = [
    "FRESH_SPLIT",
    "KINDS",
    "NEAR_LINE_CASES",
    "ORDER_ID_PATTERN",
    "REFUND_WINDOW_DAYS",
    "SPLITS",
    "TOOLS",
    "SupportDesk",
    "counterfactual_turns",
    "decision_fields",
    "oracle_turns",
    "policy_note_label",
    "tasks_sample",
    "turn_reference",
    "turn_target",
]
