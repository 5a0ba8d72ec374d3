"""The audit row of a change to a deployment's judge: its endpoint or its correction mode
decide which scores and corrections training may use, so who changed them, and from what
to what, is kept with the other administrative changes."""

from __future__ import annotations

from typing import Any

from feedback.models import DeploymentJudge
from feedback.services.judging import deployment_judge_changed
from training.promotion.models import AuditAction
from training.services.audit import audit_record
from webapp.kernel.actor import current_actor


def judge_change_record(
    *, sender: Any = None, judge: DeploymentJudge, changes: dict[str, list[str]], created: bool, **_: Any
) -> None:
    if not changes:
        return
    detail = ", ".join(f"{f}: {old or '—'} → {new}" for f, (old, new) in changes.items())
    audit_record(
        action=AuditAction.JUDGE_CHANGED,
        deployment=judge.deployment,
        actor=current_actor(),
        detail=("judge set: " if created else "judge changed: ") + detail,
        data={"changes": changes, "created": created},
    )


def judge_audit_connect() -> None:
    deployment_judge_changed.connect(judge_change_record, dispatch_uid="judge_change_record")
