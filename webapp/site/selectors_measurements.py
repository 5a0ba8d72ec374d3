"""Base vs candidate from the demo agent's measured runs: success, collateral changes and
policy violations per slice (the test split, each fresh slice), over seeds, with 95 %
intervals, and the gain with its task-bootstrap interval (`slice_summaries`).

A run is one `demo-<run>-<split>-<index>` batch of traces (feedback/demo/agent.py); its
slice is the trace metadata's `split`, and `fresh-<seed>` for a freshly generated slice.
Each run served by a trained version (not a base model) is paired with the latest base run
of the same slice before it, each base run once: the k-th pair of a slice is seed k. That is
how `make tour-demo` measures (base, train, candidate, per seed) and how a person doing the
tour by hand does it once.

Success is each trace's `outcome` grade (feedback/services/grades.py). Collateral changes — writes
to records the task does not concern — and policy violations — writes to the task's own
records that its expected outcome does not contain — are recomputed from the logged
conversation (`episode_replay`: the tool calls run again in a fresh copy of the task's
records), so a harness that reports only its grade still has them counted; an episode whose
environment or task is unknown here is left out of those rates and counted as such.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import defaultdict
from datetime import timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import Count, Max
from django.utils import timezone

from feedback.models import Grade, GradeOutcome, Message, Trace
from feedback.selectors.traces import message_as_openai
from training.environments import Environment, Task, environment_get, episode_replay
from training.serving.models import ModelVersionKind

OUTCOME_GRADE = "outcome"  # the grade the overview's success rates count (a grade's default name)
MEASURED_SPLITS = ("test", "fresh")
MAX_TRACES = 2000  # the latest measured traces a summary reads (a 3-seed tour holds 576)
MAX_REPLAY_MESSAGES = 64  # longer conversations are left out of the collateral rate
CACHE_SECONDS = 120
FRESH_SEEDS_SEARCHED = 32  # traces logged before they named their fresh seed are placed by task


@functools.lru_cache(maxsize=16)
def _environment(name: str) -> Environment | None:
    try:
        return environment_get(name)
    except KeyError:
        return None


@functools.lru_cache(maxsize=16)
def _tasks(name: str) -> dict[str, Task]:
    env = _environment(name)
    return {t.id: t for t in env.tasks()} if env is not None else {}


@functools.lru_cache(maxsize=256)
def _fresh_tasks(name: str, seed: int) -> dict[str, Task]:
    env = _environment(name)
    try:
        return {t.id: t for t in env.tasks_fresh(seed=seed)} if env is not None else {}
    except NotImplementedError:
        return {}


def _fresh_seed_of(environment: str, task_id: Any) -> str:
    """The fresh slice a task belongs to, for traces logged before they named it ("?" if none)."""
    for seed in range(FRESH_SEEDS_SEARCHED):
        if isinstance(task_id, str) and task_id in _fresh_tasks(environment, seed):
            return str(seed)
    return "?"


def _task(trace: Trace) -> Task | None:
    """The task a trace's episode played; None when it is not known here (another
    environment, a store generated otherwise)."""
    name = trace.environment or ""
    task_id = trace.metadata.get("task_id")
    if not isinstance(task_id, str):
        return None
    if trace.metadata.get("split") == "fresh":
        seed = str(trace.metadata.get("fresh_seed") or "")
        return _fresh_tasks(name, int(seed)).get(task_id) if re.fullmatch(r"[0-9]{1,5}", seed) else None
    return _tasks(name).get(task_id)


def _audit(trace: Trace, messages: list[dict[str, Any]]) -> tuple[bool, bool] | None:
    """Whether the episode changed a record its task does not concern, and whether it wrote
    to its own records against the task's expected outcome (a policy violation); None when
    its task is not known here."""
    task = _task(trace)
    env = _environment(trace.environment or "")
    if task is None or env is None:
        return None
    _grade, audit = episode_replay(env, task, messages)
    return bool(audit.collateral_changes), bool(audit.policy_violations)


def _figures(
    version: str, graded: list[Trace], success: dict[int, bool], audits: dict[int, tuple[bool, bool] | None]
) -> dict:
    replayed = [audits[t.pk] for t in graded if audits.get(t.pk) is not None]
    return {
        "version": version,
        "graded": len(graded),
        "success_rate": sum(success[t.pk] for t in graded) / len(graded) if graded else 0.0,
        "replayed": len(replayed),
        "collateral_rate": sum(a[0] for a in replayed) / len(replayed) if replayed else None,
        "violation_rate": sum(a[1] for a in replayed) / len(replayed) if replayed else None,
        "per_episode": [
            {
                "index": t.external_id.rsplit("-", 1)[-1],
                "task": t.metadata.get("task_id"),
                "kind": str(task.hidden.get("kind") or "") if (task := _task(t)) is not None else "",
                "success": success[t.pk],
                "collateral": audits[t.pk][0] if audits.get(t.pk) is not None else None,
                "violations": audits[t.pk][1] if audits.get(t.pk) is not None else None,
            }
            for t in graded
        ],
    }


def measured_runs(
    *, deployment: str, days: int | None = None, max_traces: int = MAX_TRACES
) -> tuple[list[dict[str, Any]], list[str]]:
    """The deployment's paired runs: ([{"seed", "base": {slice: figures}, "candidate": {…}}],
    slices in the order first measured). Figures: version, graded, success_rate, replayed,
    collateral_rate and violation_rate (None: nothing replayable), per_episode [{index, task,
    kind, success, collateral, violations}], the shape `scripts/tour_demo.py` writes to its
    result.json. Reads the
    latest `max_traces` graded test and fresh traces that a model version served (in the
    last `days` days, if given), whole runs only: the oldest run is left out when the cap
    cuts into it. The answer is cached (two minutes at most) until a trace, a message or a
    grade arrives."""
    recent = Trace.objects.filter(
        deployment__name=deployment,
        external_id__startswith="demo-",
        model_version__isnull=False,
        metadata__split__in=MEASURED_SPLITS,
    )
    if days is not None:
        recent = recent.filter(started_at__gte=timezone.now() - timedelta(days=days))
    marks = recent.aggregate(last=Max("id"), n=Count("id"), changed=Max("updated_at"))
    graded_mark = Grade.objects.filter(
        deployment__name=deployment, name=OUTCOME_GRADE, trace__external_id__startswith="demo-"
    ).aggregate(last=Max("id"), changed=Max("updated_at"))
    key = (
        "measured-runs:"
        + hashlib.blake2b(
            repr((deployment, days, max_traces, marks["last"], marks["n"], marks["changed"], graded_mark)).encode(),
            digest_size=16,
        ).hexdigest()
    )
    cached = cache.get(key)
    if cached is None:
        cached = _measured_runs(recent, max_traces, ModelVersionKind.BASE)
        cache.set(key, cached, CACHE_SECONDS)
    return cached


def _measured_runs(recent, max_traces: int, base_kind: str) -> tuple[list[dict[str, Any]], list[str]]:
    traces = list(
        recent.filter(grades__name=OUTCOME_GRADE)
        .select_related("model_version")
        .distinct()
        .order_by("-started_at", "-id")[: max_traces + 1]
    )
    if len(traces) > max_traces:  # the cap cuts the oldest run: leave it out whole
        cut = traces[max_traces - 1].external_id.split("-")[1]
        traces = [t for t in traces[:max_traces] if t.external_id.split("-")[1] != cut]
    success = {
        trace_id: outcome == GradeOutcome.SUCCESS
        for trace_id, outcome in Grade.objects.filter(trace__in=traces, name=OUTCOME_GRADE).values_list(
            "trace_id", "outcome"
        )
    }
    traces = [t for t in traces if t.pk in success]
    # A conversation longer than any episode of an environment's budget is not replayed.
    replayable = [t for t in traces if t.message_count <= MAX_REPLAY_MESSAGES]
    history: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for m in Message.objects.filter(trace__in=replayable).order_by("trace_id", "position"):
        history[m.trace_id].append(message_as_openai(m))
    audits = {t.pk: _audit(t, history[t.pk]) for t in replayable}

    runs: dict[str, list[Trace]] = defaultdict(list)
    for t in sorted(traces, key=lambda t: (t.started_at, t.pk)):
        runs[t.external_id.split("-")[1]].append(t)
    latest_base: dict[str, dict] = {}
    pairs: dict[str, list[tuple[dict, dict]]] = defaultdict(list)
    slices: list[str] = []
    for ts in sorted(runs.values(), key=lambda ts: ts[0].started_at):
        first = ts[0]
        key = first.metadata["split"]
        if key == "fresh":
            seed = first.metadata.get("fresh_seed") or _fresh_seed_of(first.environment, first.metadata.get("task_id"))
            key = f"fresh-{str(seed)[:40]}"
        if key not in slices:
            slices.append(key)
        figures = _figures(first.model_version.name, ts, success, audits)
        if first.model_version.kind == base_kind:
            latest_base[key] = figures
        elif key in latest_base:
            # Each base measurement pairs once: two candidates after one base are not two seeds.
            pairs[key].append((latest_base.pop(key), figures))
    per_seed: list[dict[str, Any]] = []
    for key, measured in pairs.items():
        for k, (before, after) in enumerate(measured):
            while len(per_seed) <= k:
                per_seed.append({"seed": len(per_seed), "base": {}, "candidate": {}})
            per_seed[k]["base"][key] = before
            per_seed[k]["candidate"][key] = after
    return per_seed, [s for s in slices if s in pairs]
