"""Comments that no template wrote: a bank of support-lead phrasings for the support desk's
decision turn, kept apart from the simulated lead (`support_operator`), so that a reader
or a final run is measured on words its training never saw.

The bank (`data/comment_bank.json`) holds specific comments that state the decision,
vague ones that do not (a fifth), and wrong ones that ask for the opposite of the policy
(a tenth), each with the kind of order it can be written about and the action it asks
for. It is for evaluation only: no product path imports this module (an import-linter
contract and a test keep it so), so that no policy is trained on one of its phrasings. Its
readers are the probes and the final runs of `scripts/learn_from_comments.py --comments
bank`, where a judge reads the bank's words and the policy learns only what the judge made
of them (its chosen actions, a note's labels), never the words themselves; that script
refuses the arms that would train on them. Django-free.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from training.environments.base import DecisionContext
from training.environments.support_desk.store import order_kind

BANK_PATH = Path(__file__).with_name("data") / "comment_bank.json"
KINDS = ("specific", "vague", "wrong")
ASKS = ("refund", "reply")
# What a comment can be written about, by the order kinds of `support_desk.KINDS`.
FITS: dict[str, frozenset[str]] = {
    "refundable": frozenset({"refundable_recent", "refundable_near_line"}),
    "late": frozenset({"late_near_line", "long_past"}),
    "not_delivered": frozenset({"not_delivered"}),
    "already_refunded": frozenset({"already_refunded"}),
}
FIELDS = ("id", "days", "status", "item", "price")


@dataclass(frozen=True, slots=True)
class BankComment:
    id: str
    kind: str  # "specific", "vague" or "wrong"
    fits: str  # a key of FITS, or "any"
    asks: str | None  # "refund", "reply", or None (a vague comment does not say)
    text: str  # with {id}, {days}, {status}, {item}, {price} to fill from the looked-up order

    def fits_kind(self, order_kind_name: str) -> bool:
        return self.fits == "any" or order_kind_name in FITS[self.fits]

    def render(self, row: dict[str, Any]) -> str:
        """The comment about the order `row` (the lookup's result)."""
        return self.text.format(
            id=row.get("order_id", ""),
            days=row.get("delivered_days_ago"),
            status=row.get("status", ""),
            item=row.get("item", ""),
            price=row.get("price", ""),
        )


@dataclass(frozen=True, slots=True)
class BankCase:
    """A decision context, the comment a lead wrote about its wrong turn, and the answers:
    what the comment asks for (None when vague) and what the policy calls for."""

    context: DecisionContext
    comment: BankComment
    body: str
    asks: str | None
    right: str  # "refund" or "reply": the hidden policy's action


def bank_check(data: Any) -> list[BankComment]:
    """The bank's comments, or ValueError naming the first entry that is malformed."""
    if not isinstance(data, dict) or not isinstance(data.get("comments"), list):
        raise ValueError("the bank is an object with a list of comments")
    out: list[BankComment] = []
    seen: set[str] = set()
    for i, entry in enumerate(data["comments"]):
        where = f"comments[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("text"), str) or not entry["text"].strip():
            raise ValueError(f"{where}: needs a text")
        comment = BankComment(
            id=str(entry.get("id", "")),
            kind=entry.get("kind"),
            fits=entry.get("fits"),
            asks=entry.get("asks"),
            text=entry["text"],
        )
        if not comment.id or comment.id in seen:
            raise ValueError(f"{where}: needs an id of its own")
        seen.add(comment.id)
        if comment.kind not in KINDS:
            raise ValueError(f"{where}: kind must be one of {', '.join(KINDS)}")
        if comment.fits != "any" and comment.fits not in FITS:
            raise ValueError(f"{where}: fits must be 'any' or one of {', '.join(FITS)}")
        if (comment.asks is None) != (comment.kind == "vague") or (comment.asks and comment.asks not in ASKS):
            raise ValueError(f"{where}: a vague comment asks for nothing, any other asks for one of {ASKS}")
        try:
            comment.text.format(**dict.fromkeys(FIELDS, ""))
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"{where}: text may only name {', '.join(FIELDS)} ({exc})") from None
        out.append(comment)
    return out


@lru_cache(maxsize=1)
def comment_bank() -> tuple[BankComment, ...]:
    return tuple(bank_check(json.loads(BANK_PATH.read_text(encoding="utf-8"))))


def _row(context: DecisionContext) -> dict[str, Any]:
    return json.loads(context.messages[-1]["content"])


def bank_cases(*, contexts: list[DecisionContext], seed: int = 0) -> list[BankCase]:
    """Each comment of the bank paired with a decision context it fits, contexts taken in
    turn from a seeded shuffle, so that every phrasing is read once over varied orders."""
    rng = random.Random(seed)
    deck = rng.sample(contexts, len(contexts))
    out: list[BankCase] = []
    for comment in comment_bank():
        context = next((c for c in deck if comment.fits_kind(order_kind(_row(c)))), None)
        if context is None:
            continue
        deck.remove(context)
        deck.append(context)  # used: to the back, so others come first next time
        row = _row(context)
        out.append(
            BankCase(
                context=context,
                comment=comment,
                body=comment.render(row),
                asks=comment.asks,
                right="refund" if context.acts else "reply",
            )
        )
    return out
