"""Training sets from logged episodes of a task environment.

An environment whose tasks know what the right next action is (`turn_reference(task=…,
messages=…)`, e.g. support-desk's hidden refund policy) makes every logged assistant turn
of its traces a replayable item: the context up to the turn, the tools, and a programmatic
grader (`tool_action`) with the accepted actions as the reference. A GRPO job then
resamples each turn and rewards the samples the policy would accept — no judge needed.

The traces are found by the metadata the agent sent (`environment`, `task_id`, `split`);
only the environment's training split is used, so its validation and test tasks stay unseen.
"""

from __future__ import annotations

import importlib
import random
from collections import defaultdict
from typing import Any

from feedback.models import Message, MessageRole, Trace
from feedback.selectors.traces import message_as_openai
from training.environments import environment_get
from training.models import TrainingItemKind, TrainingSet
from training.services.training_sets import TrainingSetError, training_set_create
from training.serving.models import Deployment

MAX_TRACES = 2000
MAX_VARIANTS = 16


def _turn_function(env, name: str, what: str):
    # An environment written as a package (support_desk) exports its turn functions from the
    # package, beside the module that defines its class.
    module_name = type(env).__module__
    package = module_name.rpartition(".")[0]
    function = getattr(importlib.import_module(module_name), name, None)
    if function is None and package:
        function = getattr(importlib.import_module(package), name, None)
    if function is None:
        raise TrainingSetError([("environment", f"{env.name!r} cannot {what} (no {name})")])
    return function


def episode_turn_items(
    *,
    deployment: Deployment,
    environment: str,
    split: str = "train",
    limit: int = MAX_TRACES,
    first_turns: bool = True,
    targets: bool = False,
    variants: int = 0,
) -> list[dict[str, Any]]:
    """One item per assistant turn of the deployment's latest `limit` traces of
    `environment`'s `split` tasks that have a programmatic grade. Without `first_turns`,
    only the turns after the agent's first one (e.g. when a harness constrains its first
    turn differently from the rest). With `targets`, each item also carries the accepted
    action written out as a corrected response (`turn_target`), for an SFT job, and with
    `variants` (targets only), that many counterfactual copies of each decision point
    (`counterfactual_turns`: the looked-up facts changed, the target the policy's answer
    to them), on the same side of the held-out split as the turn they copy.

    Every target here is an oracle label (the environment's hidden answer), not anybody's
    feedback; the items' provenance says so."""
    try:
        env = environment_get(environment)
    except KeyError as exc:
        raise TrainingSetError([("environment", str(exc.args[0]))]) from None
    reference_for = _turn_function(env, "turn_reference", "grade a single turn")
    target_for = _turn_function(env, "turn_target", "write a corrected turn") if targets else None
    if variants and not targets:
        raise TrainingSetError([("variants", "counterfactual copies need targets (an SFT set)")])
    if not 0 <= variants <= MAX_VARIANTS:
        raise TrainingSetError([("variants", f"must be between 0 and {MAX_VARIANTS}")])
    variants_for = _turn_function(env, "counterfactual_turns", "vary a decision point") if variants else None
    tasks = {t.id: t for t in env.tasks()}
    traces = list(
        Trace.objects.filter(deployment=deployment, environment=environment, metadata__split=split).order_by(
            "-started_at", "-id"
        )[:limit]
    )
    # The split a trace's metadata claims must be its task's own: a test task logged as
    # "train" stays out of training.
    traces = [t for t in traces if getattr(tasks.get(t.metadata.get("task_id")), "split", None) == split]
    history: dict[int, list[Message]] = defaultdict(list)
    for m in Message.objects.filter(trace__in=traces).order_by("trace_id", "position"):
        history[m.trace_id].append(m)
    items = []
    for trace in sorted(traces, key=lambda t: t.external_id):
        task = tasks[trace.metadata["task_id"]]
        messages = history[trace.pk]
        first = True
        for turn in messages:
            if turn.role != MessageRole.ASSISTANT or turn.finish_reason in ("error", "client_disconnect"):
                continue
            if first:
                first = False
                if not first_turns:
                    continue
            context = [message_as_openai(m) for m in messages if m.position < turn.position]
            reference = reference_for(task=task, messages=context)
            if reference is None or not context:
                continue
            key = f"episode:{trace.deployment_id}:{trace.external_id}:{turn.position}"
            provenance = {"environment": environment, "task_id": task.id, "split": split}
            if target_for:
                provenance["labels"] = "oracle"
            items.append(
                {
                    "kind": TrainingItemKind.TASK,
                    "key": key,
                    "messages": context,
                    "tools": trace.tools or task.tools,
                    "reference": reference,
                    "grader": "tool_action",
                    "logged_response": message_as_openai(turn),
                    "corrected_response": target_for(task=task, messages=context) if target_for else None,
                    "trace_id": trace.pk,
                    "message_id": turn.pk,
                    "provenance": provenance,
                }
            )
            if variants_for is None:
                continue
            rng = random.Random(key)  # the same copies on every rebuild
            for j, copy in enumerate(variants_for(task=task, messages=context, count=variants, rng=rng), start=1):
                items.append(
                    {
                        "kind": TrainingItemKind.TASK,
                        "key": f"{key}:counterfactual-{j}",
                        "split_key": key,
                        "messages": copy["messages"],
                        "tools": trace.tools or task.tools,
                        "reference": copy["reference"],
                        "grader": "tool_action",
                        "corrected_response": copy["target"],
                        "trace_id": trace.pk,
                        "provenance": {**provenance, "counterfactual": j},
                    }
                )
    return items


def training_set_from_episodes(
    *,
    deployment: Deployment,
    environment: str,
    name: str,
    split: str = "train",
    heldout_fraction: float = 0.2,
    limit: int = MAX_TRACES,
    first_turns: bool = True,
    targets: bool = False,
    variants: int = 0,
    user=None,
) -> TrainingSet:
    """The next version of `name`: every graded turn of the logged `environment` episodes."""
    items = episode_turn_items(
        deployment=deployment,
        environment=environment,
        split=split,
        limit=limit,
        first_turns=first_turns,
        targets=targets,
        variants=variants,
    )
    return training_set_create(
        name=name,
        items=items,
        deployment=deployment,
        selection={
            "kind": "episodes",
            "environment": environment,
            "split": split,
            "limit": limit,
            "first_turns": first_turns,
            "targets": targets,
            "variants": variants,
        },
        description=f"every graded turn of the {environment} episodes ({split} tasks)",
        heldout_fraction=heldout_fraction,
        user=user,
    )
