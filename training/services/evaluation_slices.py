"""Evaluation slices: a failure mode's turns as a training set whose items are all held out.

"Make an evaluation slice" on the failure-modes page turns the assistant turns a cluster's
notes are about (each comment's turn, each failing judgement's) into the held-out items an
evaluation compares a candidate and the live version on (`items_from_training_set`), so the
set is chosen, with no other step, on the evaluation form and as a learning policy's
`eval_training_set`, and its win rate and judge reward are the signals a promotion's
regression check reads. It has no training items, so no job trains on it: the mistake it
holds stays a test the model never saw (docs/decisions/0029-failure-modes-feed-the-loop.md).
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils.text import slugify

from feedback.failure_modes.selectors import failure_cluster_turn_ids
from feedback.models import FailureCluster, FailureClusterMember, Message
from feedback.services.queues import REPLACED
from training.models import TrainingSet, TrainingSplit
from training.services.feedback_sets import turn_items
from training.services.training_sets import SLICE_KIND, TrainingSetError, training_set_create


def evaluation_slice_name(cluster: FailureCluster) -> str:
    """`fm-<run>-<slug of the failure mode's name>`, a training set's slug of at most 100."""
    slug = slugify(cluster.name)[:80].strip("-") or f"cluster-{cluster.pk}"
    return f"fm-{cluster.run_id}-{slug}"


def _notes_by_turn(cluster: FailureCluster) -> dict[int, list[str]]:
    """The cluster's notes (comments, failing judges' rationales) by the turn they are about."""
    notes: dict[int, list[str]] = {}
    members = FailureClusterMember.objects.filter(cluster=cluster).order_by("pk")
    for text, commented, judged in members.values_list("text", "comment__message_id", "judge_result__message_id"):
        for turn in {commented, judged} - {None}:
            notes.setdefault(turn, []).append(text)
    return notes


# A stored rubric's limits (feedback.judge.schemas.STORED_RUBRIC_SCHEMA).
MAX_CRITERIA, CRITERION_MAX = 50, 5000


def slice_rubric(rubric, critique: str) -> dict:
    """What an evaluation scores a slice item's two answers by: the judge's rubric for the turn
    (else the general one), and, weighted highest, not repeating what the failure mode's notes
    on it criticised.
    A commented turn has no rubric of its own, and under the general one a candidate that
    makes the same mistake again can still win the comparison."""
    criteria = list((rubric or {}).get("criteria") or []) if isinstance(rubric, dict) else []
    if not criteria:
        criteria = [{"criterion": settings.EVAL_DEFAULT_RUBRIC, "weight": 1}]
    critique = " ".join(critique.split())
    if critique and len(criteria) < MAX_CRITERIA:
        head = "Does not repeat the mistake reviewers criticised in an earlier answer to this turn, in their words: "
        criteria.append({"criterion": (head + f"“{critique}”")[:CRITERION_MAX], "weight": 3})
    return {"criteria": criteria}


@transaction.atomic
def evaluation_slice_from_failure_cluster(*, cluster: FailureCluster, user=None) -> tuple[TrainingSet, bool]:
    """The evaluation slice of a failure mode, `(set, True)`; a cluster has one slice: asked
    again, it returns the one already made (`(set, False)`). Refused (`TrainingSetError` on
    `cluster`) for a dismissed cluster and for one none of whose notes is on an assistant
    turn that can be replayed (one with messages before it)."""
    # Two clicks at once wait for each other here, so the second finds the first's slice.
    locked = (
        FailureCluster.objects.select_for_update(of=("self",))
        .select_related("run", "run__deployment")
        .filter(pk=cluster.pk)
        .first()
    )
    if locked is None:
        raise TrainingSetError([("cluster", REPLACED)])
    cluster = locked
    existing = TrainingSet.objects.filter(failure_cluster=cluster).first()
    if existing is not None:
        return existing, False
    if cluster.dismissed_at is not None:
        raise TrainingSetError([("cluster", "this failure mode was dismissed as not a failure mode")])
    turn_ids = set(failure_cluster_turn_ids(cluster=cluster))
    trace_ids = sorted(set(Message.objects.filter(pk__in=turn_ids).values_list("trace_id", flat=True)))
    items = [it for it in turn_items(trace_ids=trace_ids) if it["message_id"] in turn_ids]
    if not items:
        raise TrainingSetError(
            [
                (
                    "cluster",
                    "no usable turns: none of this failure mode's notes is on an assistant answer "
                    "with a conversation before it that a candidate could answer again",
                )
            ]
        )
    notes = _notes_by_turn(cluster)
    total = len(items)
    items = items[: settings.EVAL_MAX_ITEMS]  # an evaluation takes at most this many
    for item in items:
        item["split"] = TrainingSplit.HELDOUT
        item["rubric"] = slice_rubric(item.get("rubric"), " ".join(notes.get(item["message_id"], [])))
        item["provenance"] |= {"failure_cluster": cluster.pk, "failure_mode_run": cluster.run_id}
    kept = f"first {len(items)} of the {total} turns" if len(items) < total else f"{total} turns"
    training_set = training_set_create(
        name=evaluation_slice_name(cluster),
        items=items,
        deployment=cluster.run.deployment,
        selection={
            "kind": SLICE_KIND,
            "failure_cluster": cluster.pk,
            "failure_mode_run": cluster.run_id,
            "failure_mode": cluster.name,
            "flag": cluster.flag_name,
            "traces": len({it["trace_id"] for it in items}),
            "turns": total,
        },
        description=(
            f"Evaluation slice of failure mode “{cluster.name}” (failure-mode run {cluster.run_id}): the "
            f"{kept} its notes criticise, every one held out."
        ),
        heldout_fraction=0.0,
        user=user,
    )
    training_set.failure_cluster = cluster
    training_set.save(update_fields=["failure_cluster"])
    return training_set, True
