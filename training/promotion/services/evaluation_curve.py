"""An evaluation's decision curve: for an environment with a parametric rule (the support
desk's 30-day refund window), how often each version's turn right after a lookup calls the
rule's action, per value of the number the rule reads, on held-out contexts built from the
tasks the evaluation measures (`Environment.decision_contexts`). Generated through the
evaluation's own generator, so the curve is decoded as the evaluation's episodes are. The
stored shape is `training.promotion.evaluation.decision_curve.curve_summary`'s."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.conf import settings

from training.environments import environment_get
from training.promotion.evaluation.decision_curve import calls_action, curve_summary
from training.promotion.evaluation.generate import GenerationError
from training.promotion.models import Evaluation, EvaluationItemKind

logger = logging.getLogger(__name__)

# A decision needs the call's name only; a whole refund call is about 35 tokens.
CURVE_MAX_TOKENS = 48
BEAT_EVERY = 8  # contexts between two heartbeats


def decision_curve_config() -> dict[str, int]:
    """What an evaluation created now measures, from the settings: `per_point` held-out
    contexts per point (0: no curve) at `every`-th value of the curve's x (and both sides of
    its threshold)."""
    return {
        "per_point": max(0, int(settings.EVAL_DECISION_CURVE_PER_POINT)),
        "every": max(1, int(settings.EVAL_DECISION_CURVE_EVERY)),
    }


def evaluation_decision_curve(
    *, evaluation: Evaluation, generator, beat: Callable[[], bool] | None = None
) -> dict[str, Any] | None:
    """Both versions' decision curves on the evaluation's environment, or None where it has
    no environment, the environment no rule, or the evaluation asked for none. `beat()` is
    called every few contexts; when it answers False (the evaluation was cancelled) the
    curve stops and None is returned. A version that cannot answer leaves the curve with
    the error instead of failing the evaluation: the episodes are the evidence, the curve
    a reading of them."""
    source = (evaluation.sources or {}).get("environment")
    wanted = evaluation.config.get("decision_curve") or {}
    per_point, every = int(wanted.get("per_point", 0)), int(wanted.get("every", 1))
    if not source or per_point <= 0:
        return None
    try:
        env = environment_get(source["name"])
    except KeyError:
        return None
    curve = env.decision_curve()
    if curve is None:
        return None
    tasks = _evaluation_tasks(evaluation, env)
    contexts = env.decision_contexts(tasks=tasks, per_point=per_point, every=every)
    if not contexts:
        return None
    max_tokens = min(CURVE_MAX_TOKENS, int(evaluation.config.get("max_tokens", CURVE_MAX_TOKENS)))
    acts: dict[str, list[bool]] = {}
    done = 0
    for side, version in (("candidate", evaluation.candidate), ("live", evaluation.baseline)):
        acts[side] = []
        for context in contexts:
            try:
                generated = generator.generate(
                    version, messages=context.messages, tools=context.tools or None, max_tokens=max_tokens
                )
            except GenerationError as exc:
                logger.warning("decision curve of evaluation %s: %s", evaluation.pk, exc)
                return {"error": f"{version.name} could not answer: {str(exc)[:300]}"}
            acts[side].append(calls_action(generated.message, curve.action))
            done += 1
            if beat is not None and done % BEAT_EVERY == 0 and not beat():
                return None
    return curve_summary(curve=curve, contexts=contexts, acts=acts, per_point=per_point)


def _evaluation_tasks(evaluation: Evaluation, env) -> list:
    """The tasks of the evaluation's episode items, in item order (a fresh slice generated
    again from its seed)."""
    sources = list(
        evaluation.items.filter(kind=EvaluationItemKind.EPISODE).order_by("position").values_list("source", flat=True)
    )
    fresh = {s.get("fresh_seed") for s in sources if s.get("fresh_seed") is not None}
    known = {t.id: t for t in env.tasks()}
    for seed in fresh:
        known.update({t.id: t for t in env.tasks_fresh(seed=int(seed))})
    return [known[s["task_id"]] for s in sources if s.get("task_id") in known]
