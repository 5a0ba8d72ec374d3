"""Training sets: versioned, with provenance, and a train/held-out split that is a
hash of each item's stable key (so a rebuild never moves an item across the split)."""

from __future__ import annotations

import hashlib
from typing import Any

from django.db import transaction
from django.db.models import Max

from training.models import TrainingItem, TrainingItemKind, TrainingSet, TrainingSplit
from training.trainer.graders import GRADERS
from webapp.kernel.errors import Invalid

# `selection["kind"]` of a failure mode's evaluation slice (training.services.evaluation_slices).
SLICE_KIND = "failure_mode"


class TrainingSetError(Invalid, ValueError):
    def __init__(self, errors: list[tuple[str, str]]):
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors), errors=errors)


def _hash_fraction(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def split_for(key: str, heldout_fraction: float) -> str:
    """Held out when the first 8 bytes of sha256(key), read as a fraction of 2^64, fall
    below `heldout_fraction`: deterministic, uniform, independent of the other items."""
    return TrainingSplit.HELDOUT if _hash_fraction(key) < heldout_fraction else TrainingSplit.TRAIN


def _splits(
    items: list[dict[str, Any]], *, name: str, heldout_fraction: float, held_for_slices: set[int]
) -> tuple[list[str], str]:
    """Each item's side, and the group held out to keep the set evaluable ("" if none was).

        An item's own `split` and a slice's trace are fixed; the others go by the hash of their
        group (`split_key`, else `key`), and no group changes sides across versions of `name`: one
        held out by an earlier version stays held out, so no candidate trained on a later version
        has seen a test an earlier one was measured on; one trained on by an earlier version is
        never held out (even where a larger share now puts its hash below the line), so no
        candidate trained on an earlier version is measured on its own training items. (A group
        that earlier versions put on both sides stays held out.) When the hash holds nothing out
        of a set of two or more groups (6 items at 0.2: 26 % of the time), the new group — in no
        earlier version — whose hash is lowest, the nearest to the line, is held out; with no new
        group, nothing is, and the set says it cannot be evaluated. Likewise, when the hash holds
        every group out, the highest trains (unless an earlier version held it out), so a single
    group, which cannot be split, always trains."""
    fixed: list[str | None] = [
        TrainingSplit.HELDOUT if it.get("trace_id") in held_for_slices else it.get("split") for it in items
    ]
    groups = {it.get("split_key") or it["key"] for it, side in zip(items, fixed, strict=True) if side is None}
    before: dict[str, set[str]] = {TrainingSplit.HELDOUT: set(), TrainingSplit.TRAIN: set()}
    for key, split in TrainingItem.objects.filter(
        training_set__name=name, key__in=[it["key"] for it in items]
    ).values_list("key", "split"):
        before.setdefault(split, set()).add(key)
    sticky = {it.get("split_key") or it["key"] for it in items if it["key"] in before[TrainingSplit.HELDOUT]}
    trained = {it.get("split_key") or it["key"] for it in items if it["key"] in before[TrainingSplit.TRAIN]}
    held = {g for g in groups - trained if _hash_fraction(g) < heldout_fraction} | sticky
    kept = ""
    new = groups - trained - sticky
    if heldout_fraction > 0 and len(groups) >= 2 and not held and TrainingSplit.HELDOUT not in fixed and new:
        kept = min(new, key=_hash_fraction)
        held.add(kept)
    if groups and not groups - held and TrainingSplit.TRAIN not in fixed and groups - sticky:
        # Nothing left to train on (a few items at a large share, or one group whose hash fell
        # under the line): the farthest from the line trains, unless an earlier version held
        # it out. One group is never split, so it trains.
        held.discard(max(groups - sticky, key=_hash_fraction))
    sides = [
        side or (TrainingSplit.HELDOUT if (it.get("split_key") or it["key"]) in held else TrainingSplit.TRAIN)
        for it, side in zip(items, fixed, strict=True)
    ]
    return sides, kept


def evaluation_slice_traces(trace_ids: set[int]) -> set[int]:
    """Those of `trace_ids` that an evaluation slice holds a turn of. A slice is a test no
    candidate may have trained on, and another turn of the same conversation carries the same
    context and the criticised answer before it, so the whole trace stays out of training."""
    if not trace_ids:
        return set()
    return set(
        TrainingItem.objects.filter(training_set__selection__kind=SLICE_KIND, trace_id__in=trace_ids)
        .values_list("trace_id", flat=True)
        .distinct()
    )


def _next_version(name: str) -> int:
    return (TrainingSet.objects.filter(name=name).aggregate(v=Max("version"))["v"] or 0) + 1


@transaction.atomic
def training_set_create(
    *,
    name: str,
    items: list[dict[str, Any]],
    deployment=None,
    selection: dict | None = None,
    description: str = "",
    heldout_fraction: float = 0.2,
    user=None,
) -> TrainingSet:
    """Store the next version of `name` with `items` (dicts with TrainingItem's fields;
    `key` required and unique; items with the same optional `split_key` fall on the same
    side of the train/held-out split, e.g. copies of one turn; an item's own `split` wins,
    e.g. a validation file's lines, except that a turn of a trace an evaluation slice holds is
    always held out; see `_splits`: no item changes sides across versions of `name`, and with
    a held-out share and two or more items, at least one is held out unless every item was
    trained on by an earlier version). Validates everything before writing anything."""
    errors: list[tuple[str, str]] = []
    if not 0 <= heldout_fraction < 1:
        errors.append(("heldout_fraction", "must be in [0, 1)"))
    seen: set[str] = set()
    for i, item in enumerate(items):
        key = item.get("key")
        if not isinstance(key, str) or not key:
            errors.append((f"items[{i}].key", "required"))
        elif key in seen:
            errors.append((f"items[{i}].key", f"duplicate key {key!r}"))
        else:
            seen.add(key)
        messages = item.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            errors.append((f"items[{i}].messages", "must be a non-empty list of chat messages"))
        is_task = item.get("kind", TrainingItemKind.TURN) == TrainingItemKind.TASK
        if item.get("split") not in (None, *TrainingSplit.values):
            errors.append((f"items[{i}].split", f"must be one of {', '.join(TrainingSplit.values)}"))
        if is_task and item.get("grader") not in GRADERS:
            errors.append((f"items[{i}].grader", f"must be one of {', '.join(GRADERS)}"))
    if not items:
        errors.append(("items", "no items selected"))
    if errors:
        raise TrainingSetError(errors)
    selection = dict(selection or {})
    held_for_slices: set[int] = set()
    if selection.get("kind") != SLICE_KIND:
        held_for_slices = evaluation_slice_traces({t for it in items if (t := it.get("trace_id")) is not None})
    held_count = sum(1 for it in items if it.get("trace_id") in held_for_slices)
    if held_count:
        selection["held_out_for_evaluation_slices"] = held_count
    sides, kept = _splits(items, name=name, heldout_fraction=heldout_fraction, held_for_slices=held_for_slices)
    if kept:
        selection["held_out_to_evaluate"] = kept
    training_set = TrainingSet.objects.create(
        name=name,
        version=_next_version(name),
        deployment=deployment,
        selection=selection,
        description=description,
        heldout_fraction=heldout_fraction,
        created_by=user,
    )
    rows = [
        TrainingItem(training_set=training_set, split=side, **_item_fields(item))
        for item, side in zip(items, sides, strict=True)
    ]
    TrainingItem.objects.bulk_create(rows, batch_size=500)
    heldout = sum(1 for r in rows if r.split == TrainingSplit.HELDOUT)
    training_set.item_count, training_set.heldout_count = len(rows), heldout
    training_set.train_count = len(rows) - heldout
    training_set.save(update_fields=["item_count", "heldout_count", "train_count"])
    return training_set


ITEM_FIELDS = {
    "kind",
    "key",
    "messages",
    "tools",
    "rubric",
    "feedback",
    "logged_response",
    "reward",
    "corrected_response",
    "correction_source",
    "reference",
    "grader",
    "trace_id",
    "message_id",
    "provenance",
}


def _item_fields(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k in ITEM_FIELDS and v is not None}


def training_set_from_tasks(
    *, name: str, tasks: list[dict[str, Any]], heldout_fraction: float = 0.2, user=None, deployment=None
) -> TrainingSet:
    """Replayable tasks (prompt + reference answer + grader name) as a training set.
    Each task: {"prompt": str | messages, "reference": str, "grader": str, "system"?: str}."""
    items = []
    for task in tasks:
        prompt = task.get("prompt")
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt or "")}]
        if task.get("system"):
            messages = [{"role": "system", "content": task["system"]}, *messages]
        key = "task:" + hashlib.sha256(repr((messages, task.get("reference"))).encode()).hexdigest()[:24]
        items.append(
            {
                "kind": TrainingItemKind.TASK,
                "key": key,
                "messages": messages,
                "reference": str(task.get("reference", "")),
                "grader": task.get("grader", ""),
                "feedback": task.get("feedback", ""),
                "corrected_response": task.get("target", ""),
                "provenance": {"source": "tasks"},
            }
        )
    return training_set_create(
        name=name,
        items=items,
        heldout_fraction=heldout_fraction,
        user=user,
        deployment=deployment,
        selection={"kind": "tasks"},
    )


def training_items_follow_merge(*, source_id: int, target_id: int, same: dict[int, int], **_signal) -> None:
    """A stitched trace's items move to the conversation's trace, those of a repeated turn
    to the conversation's copy of that turn (receiver of feedback's `trace_merged`)."""
    for old, new in same.items():
        TrainingItem.objects.filter(message_id=old).update(message_id=new, trace_id=target_id)
    TrainingItem.objects.filter(trace_id=source_id).update(trace_id=target_id)
