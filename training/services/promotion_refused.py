"""The refusal of a promotion, a release or a rollback whose precondition does not hold
(training/services/promotion_checks.py names the preconditions; the release raises it too)."""

from __future__ import annotations

from webapp.kernel.errors import Conflict


class PromotionRefused(Conflict):
    """A precondition does not hold; `field` names what, the message says why (409)."""
