"""How far a judge that chooses actions agrees with operators, per kind: on the turns an
operator corrected by hand, is the action the judge chose (from the comments alone: operators'
corrections are shown to the judge, so only judgements made without one are counted) the one
the operator wrote? A kind is the trace's `metadata["kind"]` where the agent's harness records
one (the support desk's kinds of order), else the kind of the operator's action (a tool's name
or `reply`). The training gate (`feedback.selectors.judge_gate`) reads this for a judge in
"actions" mode, so training uses its chosen turns only where every kind is measured and agrees.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from feedback.judge.actions import id_params
from feedback.models import Correction, JudgeResult, JudgeStatus
from training.serving.models import Deployment


@dataclass(frozen=True, slots=True)
class KindAgreement:
    kind: str
    n: int
    agreed: int

    @property
    def rate(self) -> float | None:
        return self.agreed / self.n if self.n else None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rate": self.rate}


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw) if isinstance(raw, str) else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def operator_action(correction: Correction) -> dict[str, Any]:
    """An operator's corrected turn as an action: its first tool call, or a reply."""
    for call in correction.tool_calls or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and function.get("name"):
            return {"kind": "tool", "name": str(function["name"]), "arguments": _arguments(function.get("arguments"))}
    return {"kind": "reply", "text": correction.content}


def actions_agree(chosen: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """The same action: a reply for a reply (the words may differ), or the same tool on the
    same ids (every id-like argument the operator gave)."""
    if chosen.get("kind") != wanted.get("kind"):
        return False
    if wanted["kind"] == "reply":
        return True
    if chosen.get("name") != wanted.get("name"):
        return False
    given = wanted.get("arguments") or {}
    ids = [k for k in given if k in id_params({"properties": {k: {"type": "string"} for k in given}})]
    return all(str((chosen.get("arguments") or {}).get(k, "")).strip() == str(given[k]).strip() for k in ids)


def action_agreement(
    *, deployment: Deployment | None, judge_model: str, judge_base_url: str | None = None
) -> dict[str, KindAgreement]:
    """Per kind, how many of the judge's chosen actions match the operator's correction."""
    results = JudgeResult.objects.filter(
        status=JudgeStatus.SUCCEEDED, is_latest=True, action__isnull=False, judge_model=judge_model
    ).select_related("trace")
    if judge_base_url is not None:
        results = results.filter(judge_base_url=judge_base_url)
    if deployment is not None:
        results = results.filter(trace__deployment=deployment)
    # Judgements that saw an operator's correction would only copy it.
    results = results.filter(human_corrections__isnull=True)
    corrections: dict[int, Correction] = {}
    for c in Correction.objects.filter(message_id__in=results.values("message_id")).order_by("created_at", "id"):
        corrections.setdefault(c.message_id, c)
    counts: dict[str, list[int]] = {}
    for r in results:
        correction = corrections.get(r.message_id)
        if correction is None:
            continue
        wanted = operator_action(correction)
        kind = str((r.trace.metadata or {}).get("kind") or (wanted.get("name") or "reply"))
        tally = counts.setdefault(kind, [0, 0])
        tally[0] += 1
        tally[1] += actions_agree(r.action, wanted)
    return {k: KindAgreement(kind=k, n=n, agreed=a) for k, (n, a) in sorted(counts.items())}
