"""Four eyes against one person with two accounts: shared by the approval of a promotion and
the step of a rollout to all traffic before its plan completed."""

from __future__ import annotations

from training.promotion.models import PromotionRequest
from training.promotion.services.promotion_refused import Precondition
from training.services.accounts import account_ties


def check_independent(promotion: PromotionRequest, user) -> Precondition:
    """Four eyes against one person with two accounts: the approver did not create or
    change the requester's account or roles (a password they set, a role they gave), nor
    the requester the approver's (`account_ties`)."""
    label = "Independent of the requester"
    requester = promotion.requested_by
    # The requester deciding is the four-eyes check's refusal (403), not this one's.
    mine = not user.is_authenticated or user.pk == requester.pk
    ties = [] if mine else account_ties(requester=requester, approver=user)
    if not ties:
        return Precondition("independent", label, True, "")
    tie = ties[0]
    when = f"{tie.get_action_display().lower()} on {tie.at:%Y-%m-%d %H:%M:%S %Z}"
    if tie.actor_id == user.pk:
        detail = f"you created or changed {requester.get_username()}'s account or roles ({when})"
    else:
        detail = f"{requester.get_username()} created or changed your account or roles ({when})"
    return Precondition(
        "independent",
        label,
        False,
        f"{detail}: another approver, with no hand in either account, must decide",
        "requested_by",
    )
