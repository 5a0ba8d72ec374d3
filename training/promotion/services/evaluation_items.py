"""Evaluation items: what a candidate is evaluated on, snapshotted when the evaluation is
created — a training set's held-out items, hand-picked traces, or items given directly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import Q

from feedback.judge.schemas import Rubric, SchemaViolation
from feedback.models import Message, Trace
from feedback.selectors.judge import judge_results_for_messages
from feedback.selectors.traces import message_as_openai
from training.environments import environment_get
from training.models import TrainingItem, TrainingItemKind, TrainingJob, TrainingSet, TrainingSplit
from training.promotion.models import EvaluationItemKind
from training.services.training_sets import SLICE_KIND
from training.serving.models import Deployment, ModelVersion
from training.trainer.graders import GRADERS
from webapp.kernel.errors import Invalid

NOTHING_HELD_OUT = (
    "holds nothing out of training, so it cannot be evaluated: rebuild it with a held-out "
    "fraction above 0, or choose traces or an environment"
)


class EvaluationError(Invalid, ValueError):
    """The evaluation cannot be created as asked: (field, reason) pairs (400)."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{f}: {r}" if f else r for f, r in errors), errors=errors)


def _turn_items_of_trace(trace: Trace, messages: list[Message]) -> list[dict[str, Any]]:
    """A hand-picked trace's assistant turns that a judge has given a rubric, or, when none
    has, its last assistant turn (scored under the default rubric)."""
    turns = [m for m in messages if m.role == "assistant"]
    if not turns:
        return []
    latest = {
        mid: next((r for r in results if r.is_latest and r.rubric), None)
        for mid, results in judge_results_for_messages(message_ids=[m.pk for m in turns]).items()
    }
    judged = [m for m in turns if latest.get(m.pk) is not None]
    chosen = judged or [turns[-1]]
    out = []
    for m in chosen:
        result = latest.get(m.pk)
        out.append(
            {
                "kind": EvaluationItemKind.TURN,
                "key": f"trace:{trace.pk}:{m.position}",
                "source": {"trace": trace.pk, "message": m.pk, "judge_result": result.pk if result else None},
                "messages": [message_as_openai(x) for x in messages if x.position < m.position],
                "tools": trace.tools or None,
                "rubric": result.rubric if result else None,
                "logged_response": message_as_openai(m),
            }
        )
    return out


def items_from_traces(*, trace_ids: Sequence[int], deployment: Deployment) -> list[dict[str, Any]]:
    traces = {t.pk: t for t in Trace.objects.filter(pk__in=list(trace_ids), deployment=deployment)}
    missing = [t for t in trace_ids if t not in traces]
    if missing:
        raise EvaluationError([("trace_ids", f"no traces {missing[:10]} in deployment {deployment.name}")])
    by_trace: dict[int, list[Message]] = {t: [] for t in traces}
    for m in Message.objects.filter(trace_id__in=list(traces)).order_by("trace_id", "position"):
        by_trace[m.trace_id].append(m)
    out: list[dict[str, Any]] = []
    for trace_id in trace_ids:
        out += _turn_items_of_trace(traces[trace_id], by_trace[trace_id])
    return out


def _check_given_item(i: int, item: Any) -> list[tuple[str, str]]:
    where = f"items[{i}]"
    if not isinstance(item, dict):
        return [(where, "must be an object")]
    errors = []
    messages = item.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        errors.append((f"{where}.messages", "must be a non-empty list of chat messages"))
    elif messages[-1].get("role") == "assistant":
        errors.append((f"{where}.messages", "must end before the assistant turn to generate"))
    if item.get("tools") is not None and not isinstance(item["tools"], list):
        errors.append((f"{where}.tools", "must be a list of tool definitions"))
    grader = item.get("grader") or ""
    if grader and grader not in GRADERS:
        errors.append((f"{where}.grader", f"unknown grader {grader!r}; known: {', '.join(GRADERS)}"))
    if grader and not isinstance(item.get("reference"), str):
        errors.append((f"{where}.reference", "a graded item needs its reference answer"))
    if item.get("rubric") is not None:
        try:
            Rubric.from_data(item["rubric"])
        except SchemaViolation as exc:
            errors.append((f"{where}.rubric", str(exc)))
    return errors


def items_given(items: Sequence[Any]) -> list[dict[str, Any]]:
    """Items given directly (API): context messages, optional tools, rubric, grader and
    reference. All are checked before any is stored."""
    errors = [e for i, item in enumerate(items) for e in _check_given_item(i, item)]
    if errors:
        raise EvaluationError(errors)
    return [
        {
            "kind": EvaluationItemKind.TASK if item.get("grader") else EvaluationItemKind.TURN,
            "key": str(item.get("key") or f"given:{i}")[:300],
            "source": {"given": i},
            "messages": item["messages"],
            "tools": item.get("tools"),
            "rubric": item.get("rubric"),
            "reference": item.get("reference") or "",
            "grader": item.get("grader") or "",
        }
        for i, item in enumerate(items)
    ]


def items_from_training_set(*, training_set) -> list[dict[str, Any]]:
    """The set's held-out items: logged turns (scored by the judge under their rubric) and
    replayable tasks (graded against their reference)."""
    rows = TrainingItem.objects.filter(training_set=training_set, split=TrainingSplit.HELDOUT).order_by("id")
    out = []
    for item in rows:
        task = item.kind == TrainingItemKind.TASK
        out.append(
            {
                "kind": EvaluationItemKind.TASK if task else EvaluationItemKind.TURN,
                "key": item.key[:300],
                "source": {
                    "training_item": item.pk,
                    "training_set": training_set.pk,
                    "trace": item.trace_id,
                    "message": item.message_id,
                },
                "messages": item.messages,
                "tools": item.tools or None,
                "rubric": item.rubric or None,
                "reference": item.reference,
                "grader": item.grader,
                "logged_response": item.logged_response,
            }
        )
    if not out:
        raise EvaluationError([("training_set", f"{training_set} {NOTHING_HELD_OUT}")])
    return out


def check_unseen(*, candidate, training_set) -> None:
    """Refuse (`training_set`) a set some of whose held-out items the candidate, or a version
    it was trained from, trained on: the same turn as a training item of the set a job made one
    of them from, or, for a failure mode's evaluation slice, any turn of the same trace (the
    slice is the test of that mistake; a turn after it answers the same conversation). A
    comparison there measures what was learnt, not whether it carries over."""
    lineage, version_id = [], candidate.pk
    while version_id is not None and version_id not in lineage:
        lineage.append(version_id)
        version_id = ModelVersion.objects.filter(pk=version_id).values_list("parent_id", flat=True).first()
    trained_sets = set(
        TrainingJob.objects.filter(result_version__in=lineage, training_set__isnull=False).values_list(
            "training_set", flat=True
        )
    )
    if not trained_sets:
        return
    trained = TrainingItem.objects.filter(training_set__in=trained_sets, split=TrainingSplit.TRAIN)
    seen = Q(key__in=trained.values("key"))
    if (training_set.selection or {}).get("kind") == SLICE_KIND:
        seen |= Q(trace_id__in=trained.exclude(trace_id=None).values("trace_id"))
    heldout = TrainingItem.objects.filter(training_set=training_set, split=TrainingSplit.HELDOUT)
    count = heldout.filter(seen).count()
    if not count:
        return
    names = ", ".join(str(s) for s in TrainingSet.objects.filter(pk__in=trained_sets).order_by("pk"))
    raise EvaluationError(
        [
            (
                "training_set",
                f"{count} of the {heldout.count()} held-out items of {training_set} were trained on by "
                f"{candidate.name} or a version it was trained from (training set {names}): "
                "an evaluation there measures what it was taught, not what it learnt",
            )
        ]
    )


MAX_ENVIRONMENT_TASKS = 500


def environment_split_default(env) -> str:
    """The split an evaluation measures by default: `test` where the environment has one,
    else `heldout` (the tasks no training set is built from)."""
    splits = {t.split for t in env.tasks()}
    return "test" if "test" in splits else "heldout"


def environment_tasks(*, environment: str, split: str = "", fresh_seed: int | None = None) -> list:
    """The tasks of `environment`'s `split` (its default when empty), or, with `fresh_seed`,
    a slice generated anew from that seed (`Environment.tasks_fresh`)."""
    try:
        env = environment_get(environment)
    except KeyError as exc:
        raise EvaluationError([("environment", str(exc.args[0]))]) from None
    if fresh_seed is not None:
        try:
            return env.tasks_fresh(seed=fresh_seed)
        except NotImplementedError as exc:
            raise EvaluationError([("fresh_seed", str(exc))]) from None
    split = split or environment_split_default(env)
    tasks = [t for t in env.tasks() if t.split == split]
    if not tasks:
        known = ", ".join(sorted({t.split for t in env.tasks()})) or "none"
        raise EvaluationError([("environment_split", f"{environment} has no {split!r} tasks; its splits: {known}")])
    return tasks


def items_from_environment(
    *, environment: str, split: str = "", count: int | None = None, fresh_seed: int | None = None
) -> list[dict[str, Any]]:
    """Whole episodes of `environment`'s tasks, run by each version from the task's opening
    messages to its end in a fresh sandbox: graded on the final state, and audited for writes
    to records the task does not concern and tool calls on ids never shown. `count` keeps the
    first tasks of the split (in the environment's order)."""
    if count is not None and not 1 <= count <= MAX_ENVIRONMENT_TASKS:
        raise EvaluationError([("environment_tasks", f"between 1 and {MAX_ENVIRONMENT_TASKS}")])
    tasks = environment_tasks(environment=environment, split=split, fresh_seed=fresh_seed)
    if count is not None:
        tasks = tasks[:count]
    return [
        {
            "kind": EvaluationItemKind.EPISODE,
            "key": f"{environment}:{task.id}"[:300],
            "source": {
                "environment": environment,
                "task_id": task.id,
                "split": task.split,
                **({"fresh_seed": fresh_seed} if fresh_seed is not None else {}),
            },
            "messages": task.first_messages(),
            "tools": task.tools or None,
            "grader": "environment" if task.hidden.get("graded", True) else "",
        }
        for task in tasks
    ]
