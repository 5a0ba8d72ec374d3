"""The student-teacher gap of a model version, stored, and the check that offers
comment-conditioned distillation and hinted GRPO only where the comment moves the model.

The rule, for a job that places the comment at `hint_at` (`hint_offer`, which the job form and
the job check both use): the version's latest probe at that placement decides; with none
there, its latest probe at any other placement below the minimum refuses it too (choosing the
other placement is no way around a measured no: probe that placement to lift it); a version
never probed is allowed, with a warning on the job ("not probed"): the check must not stop
the demo or the tour, which train a fresh model without a probe first; the job's log says that
nobody measured whether the comments reach the model
(docs/decisions/0042-readers-that-choose-actions-and-the-gap-probe.md)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from training.models import GapProbe, JobKind
from training.serving.models import ModelVersion


def gap_probe_latest(*, version: ModelVersion, hint_at: str | None = None) -> GapProbe | None:
    """The version's latest probe (with the comment placed at `hint_at`, when given)."""
    probes = GapProbe.objects.filter(version=version)
    return (probes.filter(hint_at=hint_at) if hint_at else probes).first()


HINT_PLACEMENTS = ("system", "last")


@dataclass(frozen=True, slots=True)
class HintOffer:
    offered: bool
    probe: GapProbe | None  # the probe that decides; None when the version was never probed
    # True when `probe` is of another placement than the job's (none at the job's own).
    borrowed: bool


def hint_offer(*, probes: Iterable[GapProbe], hint_at: str) -> HintOffer:
    """Whether a hint placed at `hint_at` is offered, from a version's probes (newest first)."""
    latest_any: GapProbe | None = None
    for probe in probes:
        if probe.hint_at == hint_at:
            return HintOffer(probe.gap >= settings.TRAINING_MIN_HINT_GAP, probe, False)
        latest_any = latest_any or probe
    if latest_any is None:
        return HintOffer(True, None, False)
    return HintOffer(latest_any.gap >= settings.TRAINING_MIN_HINT_GAP, latest_any, True)


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
    offer = hint_offer(probes=GapProbe.objects.filter(version=version), hint_at=hint_at)
    probe = offer.probe
    if probe is None:
        return True, (
            f"warning: {version.name} was not probed with the comment at {hint_at}: nobody measured whether "
            f"a comment in its context moves it to the right action ({use} needs a student-teacher gap of at "
            f"least {minimum:.2f}; run `manage.py probe_gap {version.name} --hint-at {hint_at}`)"
        )
    said = (
        f"student-teacher gap of {version.name} with the comment at {probe.hint_at}: {probe.gap:+.3f} "
        f"(P(right | comment) {probe.p_with:.3f} - P(right | none) {probe.p_without:.3f}, {probe.n} decision "
        f"contexts, probe {probe.pk})"
    )
    if not offer.offered:
        refused = (
            f"{use} is not offered for this model: {said}, below {minimum:.2f}. The comments barely change "
            "what it does, so a teacher that reads them has little to teach; use SFT on corrections or "
            "labels from a judge that reads the comments instead"
        )
        if offer.borrowed:
            refused += (
                f". It was not probed with the comment at {hint_at}; if that placement may differ, run "
                f"`manage.py probe_gap {version.name} --hint-at {hint_at}`"
            )
        return False, refused
    if offer.borrowed:
        return True, (
            f"warning: {version.name} was not probed with the comment at {hint_at}; {said} (run "
            f"`manage.py probe_gap {version.name} --hint-at {hint_at}`)"
        )
    return True, said
