"""The student-teacher gap of a model version, stored, and the check that offers
comment-conditioned distillation and hinted GRPO only where the comment moves the model.

A version never probed is allowed, with a warning on the job ("not probed"): the check must
not stop the demo or the tour, which train a fresh model without a probe first; the job's log
says that nobody measured whether the comments reach the model
(docs/decisions/0042-readers-that-choose-actions-and-the-gap-probe.md)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from training.models import GapProbe, JobKind
from training.serving.models import ModelVersion


def gap_probe_latest(*, version: ModelVersion, hint_at: str | None = None) -> GapProbe | None:
    """The version's latest probe (with the comment placed at `hint_at`, when given)."""
    probes = GapProbe.objects.filter(version=version)
    return (probes.filter(hint_at=hint_at) if hint_at else probes).first()


@transaction.atomic
def gap_probe_record(
    *, version: ModelVersion, result: dict[str, Any], split: str = "train", hint_at: str = "system", user=None
) -> GapProbe:
    """Store one probe's result (`GapResult.as_dict()`)."""
    return GapProbe.objects.create(
        version=version,
        split=split,
        hint_at=hint_at,
        n=int(result["n"]),
        p_with=float(result["p_with"]),
        p_without=float(result["p_without"]),
        gap=float(result["gap"]),
        per_kind=result.get("per_kind") or {},
        created_by=user,
    )


def uses_hint(kind: str, config: Any) -> str:
    """What of the comment-as-hint a job would train with ("" when nothing)."""
    if kind == JobKind.DISTILL:
        return "comment-conditioned distillation"
    if kind == JobKind.GRPO and getattr(config, "hint_samples", 0) > 0:
        return "hinted GRPO"
    return ""


def hint_gap_verdict(*, kind: str, config: Any, version: ModelVersion) -> tuple[bool, str]:
    """(allowed, what to say): refused when the version's latest gap is under
    PRACTICUM_TRAINING_MIN_HINT_GAP, allowed with a warning when it was never probed, and
    allowed with the figure when it reaches the minimum. ("", True) for a job that uses no hint."""
    use = uses_hint(kind, config)
    if not use:
        return True, ""
    minimum = settings.TRAINING_MIN_HINT_GAP
    # The gap of the placement the job uses: a comment read last moves a small model in
    # other ways than one in the system message (docs/experiments/2026-12-02-comment-hints.md).
    hint_at = getattr(config, "hint_at", "system")
    probe = gap_probe_latest(version=version, hint_at=hint_at)
    if probe is None:
        return True, (
            f"warning: {version.name} was not probed with the comment at {hint_at}: nobody measured whether "
            f"a comment in its context moves it to the right action ({use} needs a student-teacher gap of at "
            f"least {minimum:.2f}; run `manage.py probe_gap {version.name} --hint-at {hint_at}`)"
        )
    said = (
        f"student-teacher gap of {version.name}: {probe.gap:+.3f} (P(right | comment) {probe.p_with:.3f} - "
        f"P(right | none) {probe.p_without:.3f}, {probe.n} decision contexts, probe {probe.pk})"
    )
    if probe.gap < minimum:
        return False, (
            f"{use} is not offered for this model: {said}, below {minimum:.2f}. The comments barely change "
            "what it does, so a teacher that reads them has little to teach; use SFT on corrections or "
            "labels from a judge that reads the comments instead"
        )
    return True, said
