"""The live pointer moved by hand (`set_live`, `prepare_model --live-for`, `demo_setup`, the
experiment scripts), with the audit row a release writes when it switches: one trail of what
went live, whichever route it took. The release itself switches in `training/promotion/services/release.py`.
Refused while a progressive release is under way, as an approval is: its check compares the
candidate with the version it replaces, and a pointer moved under it would change the baseline."""

from __future__ import annotations

from django.db import transaction

from training.promotion.models import AuditAction
from training.promotion.services.promotion_checks import check_no_rollout_running, raise_first_unmet
from training.services.audit import audit_record
from training.serving.models import Deployment, LiveChangeKind, LiveVersion, ModelVersion
from training.serving.services import live_version_set


@transaction.atomic
def live_set_by_command(*, deployment: Deployment, version: ModelVersion, reason: str, actor=None) -> LiveVersion:
    """Point `deployment` at `version` (the checks are `live_version_set`'s: a failed version
    or one a rollback withdrew is refused) and, when the pointer moved, record it as a
    release's switch is recorded: `live_switched`, from and to, with the reason. A progressive
    release under way refuses it (`PromotionRefused`, naming the release and how to end it)."""
    raise_first_unmet([check_no_rollout_running(deployment)])
    before = LiveVersion.objects.select_for_update().filter(deployment=deployment).select_related("version").first()
    previous = before.version if before else None
    live = live_version_set(deployment=deployment, version=version, user=actor, reason=reason, kind=LiveChangeKind.SET)
    if previous is None or previous.pk != version.pk:
        audit_record(
            action=AuditAction.LIVE_SWITCHED,
            deployment=deployment,
            actor=actor,
            from_version=previous,
            to_version=version,
            detail=reason,
        )
    return live
