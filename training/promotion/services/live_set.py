"""The live pointer moved by hand (`set_live`, `prepare_model --live-for`, `demo_setup`, the
experiment scripts). The move is recorded as every route's is, by `live_version_set` in the
pointer's trail (`LiveVersionChange`: who, why, `set` by a command), which the audit log
shows; a release switches in `training/promotion/services/release.py`.
Refused while a progressive release is under way, as an approval is: its check compares the
candidate with the version it replaces, and a pointer moved under it would change the baseline."""

from __future__ import annotations

from django.db import transaction

from training.promotion.services.promotion_checks import check_no_rollout_running, raise_first_unmet
from training.serving.models import Deployment, LiveChangeKind, LiveVersion, ModelVersion
from training.serving.services import live_version_set


@transaction.atomic
def live_set_by_command(*, deployment: Deployment, version: ModelVersion, reason: str, actor=None) -> LiveVersion:
    """Point `deployment` at `version` (the checks are `live_version_set`'s: a failed version
    or one a rollback withdrew is refused). A progressive release under way refuses it
    (`PromotionRefused`, naming the release and how to end it)."""
    raise_first_unmet([check_no_rollout_running(deployment)])
    return live_version_set(deployment=deployment, version=version, user=actor, reason=reason, kind=LiveChangeKind.SET)
