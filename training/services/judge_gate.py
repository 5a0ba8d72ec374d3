"""The judge's training gate, enforced where judge output would enter training: a job
whose rewards the judge scores (GRPO on turns without a grader, episodes with a judge
weight) and a training set carrying judge-written rubrics, rewards or corrections.

Closed gate: the service refuses, naming `judge_gate_override_reason`. A person may
override it with a reason; the override (who, why, when, and the gate as it stood) is
written to the audit log and kept with the job or set."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from feedback.selectors.judge_gate import judge_training_gate
from training.promotion.models import AuditAction
from training.services.audit import audit_record
from training.serving.models import Deployment
from webapp.kernel.errors import Invalid

OVERRIDE_FIELD = "judge_gate_override_reason"


class JudgeGateClosed(Invalid, ValueError):
    """A judge's training gate is closed and no acceptable override reason was given (400)."""

    field = OVERRIDE_FIELD

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.args = (f"{OVERRIDE_FIELD}: {reason}",)


def judge_gate_pass(
    *,
    deployments: list[Deployment | None],
    uses: str,
    override_reason: str = "",
    user=None,
    audit_on: list[Deployment] | tuple[Deployment, ...] = (),
) -> dict[str, Any]:
    """Check the gate of each deployment's judge for `uses` (what the judge's output is for).
    `None` stands for the settings' judge (a job of no deployment): its override is audited
    on `audit_on`, the deployments whose conversations the output trains on, or with no
    deployment when there is none: an override is never left out of the audit log.

    Returns what to keep with the job or set: the gates, and the override when one was
    needed. Raises `JudgeGateClosed` when a gate is closed and no reason was given, or the
    overriding person is unknown."""
    now = timezone.now()
    gates = [(d, judge_training_gate(deployment=d)) for d in dict.fromkeys(deployments)]
    closed = [(d, g) for d, g in gates if not g.allowed]
    record: dict[str, Any] = {
        "uses": uses,
        "checked_at": now.isoformat(),
        "gates": [{"deployment": d.name if d else None, **g.as_dict()} for d, g in gates],
        "override": None,
    }
    if not closed:
        return record
    why = "; ".join(f"{d.name if d else 'default judge'}: {g.reason}" for d, g in closed)
    reason = override_reason.strip()
    if not reason:
        raise JudgeGateClosed(
            f"the judge's training gate is closed ({why}); {uses} needs it open, or an override with a reason "
            "(recorded in the audit log)"
        )
    if not getattr(user, "is_authenticated", False):
        raise JudgeGateClosed("overriding the judge's training gate needs a logged-in person to answer for it")
    record["override"] = {"by": user.username, "by_id": user.pk, "reason": reason[:2000], "at": now.isoformat()}
    for deployment, gate in closed:
        for on in [deployment] if deployment is not None else list(dict.fromkeys(audit_on)) or [None]:
            audit_record(
                action=AuditAction.JUDGE_GATE_OVERRIDDEN,
                deployment=on,
                actor=user,
                detail=f"{uses}: {reason[:2000]}",
                data={"gate": gate.as_dict(), "uses": uses, "judge_of": deployment.name if deployment else None},
            )
    return record
