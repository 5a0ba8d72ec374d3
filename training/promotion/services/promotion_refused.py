"""The refusal of a promotion, a release, a rollout's step or a rollback whose precondition
does not hold, the precondition itself, and who may approve: below the promotion checks, the
release and the rollouts, which all read them (training/promotion/services/promotion_checks.py names
the preconditions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from webapp.kernel.errors import Conflict

# Who may approve a promotion, advance or roll back a rollout, or roll a deployment back.
APPROVE = "training.approve_promotion"


class PromotionRefused(Conflict):
    """A precondition does not hold; `field` names what, the message says why (409)."""


@dataclass(frozen=True, slots=True)
class Precondition:
    code: str
    label: str
    ok: bool
    detail: str
    field: str = ""
    # Holds, but on evidence that cannot decide it (inconclusive or unmeasured signals): the
    # page marks it neither passed nor failed.
    warn: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "label": self.label, "ok": self.ok, "detail": self.detail, "warn": self.warn}
