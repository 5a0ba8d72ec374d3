"""Reads of what is deployed and which version is live."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Q

from training.inference.client import server_root
from training.serving.models import (
    BaseModel,
    CanarySplit,
    LiveChangeKind,
    LiveVersion,
    LiveVersionChange,
    ModelVersion,
)


def live_version_get(*, deployment_id: int) -> ModelVersion | None:
    """The version a deployment serves now, with its base model, or None."""
    live = LiveVersion.objects.select_related("version__base_model").filter(deployment_id=deployment_id).first()
    return live.version if live else None


@dataclass(frozen=True, slots=True)
class Withdrawal:
    """A version taken out of a deployment's service: when, and how (for messages)."""

    version: ModelVersion
    at: datetime
    by_rollback: bool  # else a command put an earlier version back (a rollback by hand)

    def describe(self) -> str:
        how = "rolled back from" if self.by_rollback else "taken out of service by hand"
        return f"{self.version.name} was {how} on {self.at:%Y-%m-%d %H:%M:%S %Z}".rstrip()


def _live_history(deployment_id: int) -> list[LiveVersionChange]:
    # In the order the flips happened (ids follow inserts; flips of one deployment are
    # serialised by its live row's lock).
    return list(
        LiveVersionChange.objects.filter(deployment_id=deployment_id)
        .select_related("from_version__base_model")
        .order_by("id")
    )


def live_withdrawals(*, deployment_id: int, history: list[LiveVersionChange] | None = None) -> dict[int, Withdrawal]:
    """The versions a deployment took out of service that may come back only through a new
    promotion request (by version id): each left by a rollback, or by a command that put a
    version live again that had been live before (a rollback by hand), and not promoted
    since. A version replaced by a promotion, or by a command moving on to a version never
    live here before, was not withdrawn: a rollback may return to it."""
    withdrawn: dict[int, Withdrawal] = {}
    been_live: set[int] = set()
    for change in _live_history(deployment_id) if history is None else history:
        if change.from_version_id is not None:
            back = change.kind == LiveChangeKind.ROLLBACK or (
                change.kind == LiveChangeKind.SET and change.to_version_id in been_live
            )
            if back:
                by_rollback = change.kind == LiveChangeKind.ROLLBACK
                withdrawn[change.from_version_id] = Withdrawal(change.from_version, change.changed_at, by_rollback)
            been_live.add(change.from_version_id)
        if change.kind == LiveChangeKind.PROMOTION:
            withdrawn.pop(change.to_version_id, None)
        been_live.add(change.to_version_id)
    return withdrawn


def live_rollback_target(*, deployment_id: int) -> tuple[ModelVersion | None, list[Withdrawal]]:
    """The version a rollback returns to, and the withdrawn versions it passed over: the
    most recent version that was live before the current one and was not withdrawn (so a
    rollback of a rollback goes further back, never to the version just pulled)."""
    live = LiveVersion.objects.filter(deployment_id=deployment_id).first()
    if live is None:
        return None, []
    history = _live_history(deployment_id)
    withdrawn = live_withdrawals(deployment_id=deployment_id, history=history)
    passed: dict[int, Withdrawal] = {}
    for change in reversed(history):
        version = change.from_version
        if version is None or version.pk == live.version_id:
            continue
        if version.pk in withdrawn:
            passed.setdefault(version.pk, withdrawn[version.pk])
            continue
        return version, list(passed.values())
    return None, list(passed.values())


def live_versions_for_base(*, base_model_id: int) -> list[ModelVersion]:
    """The distinct versions over one base model that some deployment serves now: its live
    versions and the candidates a progressive release routes a share of traffic to."""
    return list(
        ModelVersion.objects.filter(base_model_id=base_model_id)
        .filter(Q(live_for__isnull=False) | Q(canary_for__isnull=False))
        .select_related("base_model")
        .distinct()
    )


def base_model_replica_urls(*, base: BaseModel) -> list[str]:
    """The root URLs of the servers that serve `base`: its `inference_url` (blank: the site's
    `INFERENCE_URL`) first, then its `inference_replicas`, each once. Every reader of "where
    is this base model served" goes through here: the gateway, releases, `set_live`, the
    rollouts' allowed servers."""
    out: list[str] = []
    for url in [base.inference_url or settings.INFERENCE_URL, *(base.inference_replicas or [])]:
        root = server_root(str(url))
        if root and root not in out:
            out.append(root)
    return out


def canary_split_get(*, deployment_id: int) -> CanarySplit | None:
    """The candidate a deployment routes a share of its conversations to, with its base model."""
    return CanarySplit.objects.select_related("version__base_model").filter(deployment_id=deployment_id).first()
