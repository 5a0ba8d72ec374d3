"""Evaluating a candidate version against the deployment's live version.

`evaluation_create` snapshots the items (held-out training items, hand-picked traces, or
items given directly) and queues the run; `evaluation_run` (a worker) generates both
versions' responses to every item, scores them, and writes the summary. A redelivered run
resumes after the last finished item; cancelling sets a flag the loop checks.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from feedback.judge.client import JudgeCallFailed, JudgeNotConfigured
from feedback.judge.schemas import SchemaViolation
from feedback.judge.scoring import score_candidates
from feedback.selectors.judge import judge_endpoint_for
from training.inference.codec import message_served_text
from training.promotion.evaluation.generate import GenerationError, LocalGenerator, ServerGenerator, same_tokenizer
from training.promotion.evaluation.metrics import compare, kl_k3, response_checks, summarize
from training.promotion.models import AuditAction, Evaluation, EvaluationItem, EvaluationItemKind
from training.promotion.services.evaluation_curve import decision_curve_config, evaluation_decision_curve
from training.promotion.services.evaluation_episodes import episode_item_run
from training.promotion.services.evaluation_items import (
    EvaluationError,
    check_unseen,
    items_from_environment,
    items_from_traces,
    items_from_training_set,
    items_given,
)
from training.services.audit import audit_record
from training.services.inference import version_server
from training.serving.models import Deployment, ModelVersion, ModelVersionKind, ModelVersionStatus
from training.serving.selectors import live_version_get
from training.tasks import evaluation_run_task
from training.trainer.graders import grade
from webapp.kernel.nul import strip_nul
from webapp.kernel.stale_work import stale_work_fail
from webapp.kernel.work import (
    WorkStatus,
    work_attempts_exceeded,
    work_beat,
    work_cancel,
    work_claim,
    work_end,
    work_worker_name,
)

logger = logging.getLogger(__name__)

GENERATORS = ("auto", "server", "local")


# Create / cancel -----------------------------------------------------------------------


def _generator_for(candidate: ModelVersion, requested: str) -> str:
    if requested not in GENERATORS:
        raise EvaluationError([("generator", f"one of {', '.join(GENERATORS)}")])
    if requested != "auto":
        return requested
    if candidate.kind == ModelVersionKind.FULL:
        return "local"
    return "server" if version_server(candidate).health(timeout=2.0) else "local"


def evaluation_check(*, candidate: ModelVersion, deployment: Deployment) -> ModelVersion:
    """The baseline the candidate would be compared with (the live version); raises
    `EvaluationError` naming what is missing."""
    baseline = live_version_get(deployment_id=deployment.pk)
    if baseline is None:
        raise EvaluationError([("deployment", f"{deployment.name} has no live version to compare against")])
    if baseline.pk == candidate.pk:
        raise EvaluationError([("candidate", f"{candidate.name} is already live for {deployment.name}")])
    if candidate.status == ModelVersionStatus.FAILED:
        raise EvaluationError([("candidate", f"{candidate.name} failed; it cannot be evaluated")])
    return baseline


@transaction.atomic
def evaluation_create(
    *,
    candidate: ModelVersion,
    deployment: Deployment,
    created_by=None,
    trace_ids: Sequence[int] = (),
    items: Sequence[Any] = (),
    training_set=None,
    generator: str | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    environment: str = "",
    environment_split: str = "",
    environment_tasks: int | None = None,
    fresh_seed: int | None = None,
) -> Evaluation:
    """Snapshot the items, store the evaluation and queue its run after commit. With
    `environment`, each version also runs whole episodes of its `environment_split` tasks
    (the first `environment_tasks` of them; with `fresh_seed`, a slice generated anew), graded
    and audited for collateral changes and unknown ids."""
    baseline = evaluation_check(candidate=candidate, deployment=deployment)
    rows: list[dict[str, Any]] = []
    sources: dict[str, Any] = {}
    if training_set is not None:
        rows += items_from_training_set(training_set=training_set)
        check_unseen(candidate=candidate, training_set=training_set)
        sources["training_set"] = {"id": training_set.pk, "name": str(training_set)}
    if trace_ids:
        rows += items_from_traces(trace_ids=list(trace_ids), deployment=deployment)
        sources["traces"] = list(trace_ids)
    if items:
        rows += items_given(items)
        sources["given"] = len(items)
    if environment:
        episodes = items_from_environment(
            environment=environment, split=environment_split, count=environment_tasks, fresh_seed=fresh_seed
        )
        rows += episodes
        sources["environment"] = {
            "name": environment,
            "split": episodes[0]["source"]["split"],
            "tasks": len(episodes),
            **({"fresh_seed": fresh_seed} if fresh_seed is not None else {}),
        }
    if not rows:
        raise EvaluationError(
            [("items", "nothing to evaluate: choose a training set's held-out items, traces or an environment")]
        )
    if len(rows) > settings.EVAL_MAX_ITEMS:
        raise EvaluationError([("items", f"{len(rows)} items; at most {settings.EVAL_MAX_ITEMS} per evaluation")])
    max_tokens = settings.EVAL_MAX_TOKENS if max_tokens is None else max_tokens
    if not 1 <= max_tokens <= 8192:
        raise EvaluationError([("max_tokens", "between 1 and 8192")])
    temperature = settings.EVAL_TEMPERATURE if temperature is None else temperature
    if not 0 <= temperature <= 2:
        raise EvaluationError([("temperature", "between 0 and 2")])
    chosen = _generator_for(candidate, generator or settings.EVAL_GENERATOR)
    config = {"generator": chosen, "max_tokens": max_tokens, "temperature": temperature, "seed": 0}
    if environment:
        config["decision_curve"] = decision_curve_config()
    evaluation = Evaluation.objects.create(
        deployment=deployment,
        candidate=candidate,
        baseline=baseline,
        training_set=training_set,
        config=config,
        sources=sources,
        total=len(rows),
        created_by=created_by,
    )
    EvaluationItem.objects.bulk_create(
        EvaluationItem(evaluation=evaluation, position=i, **row) for i, row in enumerate(rows)
    )
    audit_record(
        action=AuditAction.EVALUATION_STARTED,
        deployment=deployment,
        actor=created_by,
        from_version=baseline,
        to_version=candidate,
        evaluation=evaluation,
        detail=f"{len(rows)} items, generator {chosen}",
    )

    # Local generation loads the model: it belongs with the training queue's single slot.
    queue = "training" if chosen == "local" else "default"
    evaluation_run_task.apply_async_on_commit(args=[evaluation.pk], queue=queue)
    return evaluation


def evaluation_cancel(*, evaluation: Evaluation, user=None) -> Evaluation:
    """Ask a running evaluation to stop after its current item (a queued one stops at once)."""
    return (
        work_cancel(
            Evaluation,
            pk=evaluation.pk,
            on_end=lambda row: _audit_outcome(row, actor=user, detail="cancelled before it started"),
        )
        or evaluation
    )


def _audit_outcome(evaluation: Evaluation, *, actor=None, detail: str = "") -> None:
    """The audit record of an evaluation's end, by its (terminal) status."""
    action = {
        WorkStatus.FINISHED: AuditAction.EVALUATION_FINISHED,
        WorkStatus.FAILED: AuditAction.EVALUATION_FAILED,
        WorkStatus.CANCELLED: AuditAction.EVALUATION_CANCELLED,
    }[evaluation.status]
    audit_record(
        action=action,
        deployment=evaluation.deployment,
        actor=actor,
        from_version=evaluation.baseline,
        to_version=evaluation.candidate,
        evaluation=evaluation,
        detail=detail,
    )


def _finish_if_running(
    evaluation: Evaluation, worker: str, status: str, *, error: str = "", extra: dict[str, Any] | None = None
) -> Evaluation:
    """End a running evaluation this worker holds (a cancelled or finished one with its
    summary, `extra` added to it), with its audit record; one the sweep or a cancel already
    ended keeps its outcome. Returns the row as it now is."""

    def settle(row: Evaluation) -> list[str]:
        if status not in (WorkStatus.CANCELLED, WorkStatus.FINISHED):
            return []
        row.summary = {**evaluation_summary(evaluation=row), **(extra or {})}
        if status == WorkStatus.FINISHED:
            row.done = row.items.filter(done=True).count()
        return ["summary", "done"]

    def audit(row: Evaluation) -> None:
        detail = f"cancelled after {row.done} items" if status == WorkStatus.CANCELLED else ""
        _audit_outcome(row, detail=error or detail)

    work_end(Evaluation, pk=evaluation.pk, worker=worker, status=status, error=error, settle=settle, on_end=audit)
    evaluation.refresh_from_db()
    return evaluation


def evaluations_fail_stale(*, now: datetime | None = None) -> list[int]:
    """Evaluations left running by a worker that died: failed, with an audit record, once no
    item has finished for `EVALUATION_STALE_AFTER_SECONDS`. A failed evaluation is no
    evidence for a promotion; start a new one."""

    return stale_work_fail(
        Evaluation,
        silent_after=settings.EVALUATION_STALE_AFTER_SECONDS,
        now=now or timezone.now(),
        what="evaluation's progress",
        on_failed=lambda row: _audit_outcome(row, detail=row.error),
    )


# Run (worker) --------------------------------------------------------------------------


def _make_generator(config: dict[str, Any]):
    options = {"temperature": float(config.get("temperature", 0.0)), "seed": int(config.get("seed", 0))}
    if config.get("generator") == "local":
        return LocalGenerator(**options)
    return ServerGenerator(**options)


def _judge_endpoint(deployment: Deployment):
    try:
        return judge_endpoint_for(deployment=deployment)
    except JudgeNotConfigured:
        return None


def _grading_text(message: dict[str, Any]) -> str:
    """What a grader reads of a served message: the text the model produced, its tool calls
    written back as the blocks the chat codec (and the graders, the environment's completer
    and the monitors through it) parse."""
    return message_served_text(message)


def evaluation_item_run(*, item: EvaluationItem, evaluation: Evaluation, generator, endpoint) -> None:
    """Both versions' responses to one item, their checks, judge rewards under the item's
    rubric (one call scoring both, shuffled), grader scores, the outcome and the KL."""
    if item.kind == EvaluationItemKind.EPISODE:
        episode_item_run(item=item, evaluation=evaluation, generator=generator)
        return
    config = evaluation.config
    generated = {}
    results: dict[str, dict[str, Any]] = {}
    for side, version in (("candidate", evaluation.candidate), ("baseline", evaluation.baseline)):
        try:
            g = generator.generate(
                version, messages=item.messages, tools=item.tools, max_tokens=int(config.get("max_tokens", 256))
            )
        except GenerationError as exc:
            results[side] = {"error": str(exc)[:2000]}
            continue
        generated[side] = g
        result = {
            "message": g.message,
            "finish_reason": g.finish_reason,
            "tokens": len(g.token_ids),
            **response_checks(g.message, finish_reason=g.finish_reason, tools=item.tools),
        }
        if item.grader:
            result["graded"] = grade(item.grader, _grading_text(g.message), item.reference)
        results[side] = result

    item.judge_error = ""
    wants_judge = item.kind == EvaluationItemKind.TURN or item.rubric
    if endpoint is not None and wants_judge and len(generated) == 2:
        try:
            scores = score_candidates(
                item.messages,
                item.rubric or settings.EVAL_DEFAULT_RUBRIC,
                [generated["candidate"].message, generated["baseline"].message],
                endpoint=endpoint,
                tools=item.tools or (),
                rng=random.Random(f"{evaluation.pk}:{item.position}"),
            )
        except (JudgeCallFailed, SchemaViolation) as exc:
            item.judge_error = str(exc)[:2000]
        else:
            for index, side in enumerate(("candidate", "baseline")):
                results[side]["reward"] = scores[index]
                results[side]["reason"] = scores.reasons[index]

    cand, base = results["candidate"], results["baseline"]
    if item.grader and cand.get("graded") is not None and base.get("graded") is not None:
        item.outcome = compare(cand["graded"], base["graded"])
    else:
        item.outcome = compare(cand.get("reward"), base.get("reward"))

    item.kl = None
    g = generated.get("candidate")
    if (
        g is not None
        and g.prompt_token_ids
        and g.logprobs
        and same_tokenizer(evaluation.candidate, evaluation.baseline)
    ):
        under_base = generator.token_logprobs(
            evaluation.baseline, prompt_token_ids=g.prompt_token_ids, token_ids=g.token_ids
        )
        if under_base is not None:
            item.kl = kl_k3(g.logprobs, under_base)
    # Generated text may hold U+0000, which PostgreSQL's jsonb cannot.
    item.candidate, item.baseline = strip_nul(cand), strip_nul(base)
    item.done = True
    item.save(update_fields=["candidate", "baseline", "outcome", "kl", "judge_error", "done"])


def evaluation_summary(*, evaluation: Evaluation) -> dict[str, Any]:
    rows = (
        evaluation.items.filter(done=True)
        .order_by("position")
        .values("key", "candidate", "baseline", "outcome", "kl", "judge_error")
    )
    summary = summarize(list(rows))
    summary["generator"] = evaluation.config.get("generator")
    return summary


def evaluation_run(*, evaluation_id: int, worker: str | None = None) -> Evaluation | None:
    """Run (or resume) an evaluation. A finished, failed or cancelled one is left alone."""
    worker = (worker or work_worker_name())[:200]
    # A redelivered run (its worker died) is taken over at once and resumes after the last
    # finished item.
    claimed = work_claim(Evaluation, pk=evaluation_id, worker=worker, resume_after=0)
    if claimed is None:
        return Evaluation.objects.filter(pk=evaluation_id).first()
    evaluation = (
        Evaluation.objects.select_related("candidate__base_model", "baseline__base_model", "deployment")
        .filter(pk=evaluation_id)
        .first()
    )
    if evaluation is None:
        return None
    too_many = work_attempts_exceeded(claimed)
    if too_many:
        return _finish_if_running(evaluation, worker, WorkStatus.FAILED, error=too_many)

    generator = None
    try:
        generator = _make_generator(evaluation.config)
        generator.prepare(evaluation.candidate)
        generator.prepare(evaluation.baseline)
        # Loading the versions is not the first item's time.
        work_beat(Evaluation, pk=evaluation.pk, worker=worker)
        endpoint = _judge_endpoint(evaluation.deployment)
        if endpoint is None:
            Evaluation.objects.filter(pk=evaluation.pk).update(config={**evaluation.config, "judge": None})
        else:
            Evaluation.objects.filter(pk=evaluation.pk).update(
                config={**evaluation.config, "judge": {"model": endpoint.model, "base_url": endpoint.base_url}}
            )
        for item in evaluation.items.filter(done=False).order_by("position"):
            if not work_beat(Evaluation, pk=evaluation.pk, worker=worker):
                # Cancelled; or the sweep failed it while this worker was silent, and its
                # outcome stands (`work_end` changes nothing then).
                return _finish_if_running(evaluation, worker, WorkStatus.CANCELLED)
            evaluation_item_run(item=item, evaluation=evaluation, generator=generator, endpoint=endpoint)
            work_beat(Evaluation, pk=evaluation.pk, worker=worker, done=F("done") + 1)

        curve = evaluation_decision_curve(
            evaluation=evaluation,
            generator=generator,
            beat=lambda: work_beat(Evaluation, pk=evaluation.pk, worker=worker),
        )
        if not work_beat(Evaluation, pk=evaluation.pk, worker=worker):
            return _finish_if_running(evaluation, worker, WorkStatus.CANCELLED)
        _finish_if_running(
            evaluation, worker, WorkStatus.FINISHED, extra={"decision_curve": curve} if curve is not None else None
        )
    except GenerationError as exc:
        _finish_if_running(evaluation, worker, WorkStatus.FAILED, error=str(exc)[:5000])
    except Exception as exc:
        logger.exception("evaluation %s failed", evaluation_id)
        _finish_if_running(evaluation, worker, WorkStatus.FAILED, error=f"{type(exc).__name__}: {exc}"[:5000])
    finally:
        if generator is not None:
            generator.close()
    return evaluation
