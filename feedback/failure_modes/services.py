"""The failure-mode pipeline over a batch of traces.

1. Cheap detectors (`feedback.failure_modes.detectors`) flag tool errors, invalid tool
   arguments, empty or truncated answers, refusals and answer-length outliers; each
   becomes a `TraceFlag` with source "rule", which the trace list filters on.
2. Operators' comments and the rationales of low-reward judgements on those traces are
   embedded and clustered; the judge names each cluster, and every trace with a note in
   it gets a flag with source "cluster" named after it.

A run is idempotent: flags are upserted, a run's clusters are replaced when it runs
again, and the "cluster" flags of the scanned traces are those of the latest run.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

import numpy as np
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from feedback.failure_modes.clustering import MAX_TEXTS, central_indices, cluster_embeddings, embed_texts, keyword_name
from feedback.failure_modes.detectors import (
    KINDS,
    LENGTH_OUTLIER,
    Finding,
    TraceView,
    detect_batch,
    detect_length_outliers,
    final_answer,
)
from feedback.failure_modes.naming import name_cluster
from feedback.judge.client import JudgeCallFailed, JudgeEndpoint, JudgeNotConfigured
from feedback.judge.quality import name_from_texts, name_is_readable, text_is_praise
from feedback.models import (
    Comment,
    FailureCluster,
    FailureClusterMember,
    FailureModeRun,
    JudgeResult,
    Message,
    RatingKind,
    Trace,
    TraceFlag,
    TurnRating,
)
from feedback.selectors.judge import judge_endpoint_for
from feedback.tasks import failure_mode_run_task
from webapp.kernel.chat_format import FieldError
from webapp.kernel.errors import Invalid
from webapp.kernel.stale_work import stale_work_fail
from webapp.kernel.work import WorkStatus, work_attempts_exceeded, work_beat, work_claim, work_end, work_worker_name

logger = logging.getLogger(__name__)

RULE_SOURCE = "rule"
CLUSTER_SOURCE = "cluster"
CHUNK = 500
MAX_TRACES = 100_000
NOTE_CHARS = 1000
EXAMPLES = 8


class FailureModeError(Invalid, ValueError):
    pass


def flag_name(kind: str) -> str:
    """Detector kinds as flag names (slugs with hyphens, like the other flags)."""
    return kind.replace("_", "-")


RULE_FLAG_NAMES = [flag_name(k) for k in KINDS]


@transaction.atomic
def failure_mode_run_create(
    *,
    deployment=None,
    since: datetime | None = None,
    until: datetime | None = None,
    max_traces: int = 10_000,
    created_by=None,
) -> FailureModeRun:
    if not 1 <= max_traces <= MAX_TRACES:
        raise FailureModeError(f"max_traces must be between 1 and {MAX_TRACES}")
    if since and until and until < since:
        raise FailureModeError("until is earlier than since")
    run = FailureModeRun.objects.create(
        deployment=deployment, since=since, until=until, max_traces=max_traces, created_by=created_by
    )
    failure_mode_run_task.delay_on_commit(run.pk)
    return run


class _RunEnded(Exception):
    """The run is no longer this worker's (the sweep failed it): stop here."""


def _progress(run: FailureModeRun, **fields: Any) -> None:
    """Write progress (and a heartbeat) while the run is still this worker's to write."""
    if not work_beat(FailureModeRun, pk=run.pk, worker=run.worker, **fields):
        raise _RunEnded
    for key, value in fields.items():
        setattr(run, key, value)


def failure_mode_runs_fail_stale(*, now=None) -> list[int]:
    """Runs left running by a worker that died: failed once silent for longer than
    `FAILURE_MODE_STALE_AFTER_SECONDS` (naming one cluster may take a judge's deadline)."""
    return stale_work_fail(
        FailureModeRun,
        # Naming one cluster is a judge call: never shorter than one may take.
        silent_after=max(
            settings.FAILURE_MODE_STALE_AFTER_SECONDS, settings.JUDGE_DEADLINE_S + settings.JUDGE_STALE_GRACE_S
        ),
        now=now or timezone.now(),
        what="failure-mode run's progress",
    )


def _trace_ids(run: FailureModeRun) -> list[int]:
    qs = Trace.objects.all()
    if run.deployment_id:
        qs = qs.filter(deployment_id=run.deployment_id)
    if run.since:
        qs = qs.filter(started_at__gte=run.since)
    if run.until:
        qs = qs.filter(started_at__lt=run.until)
    return list(qs.order_by("-started_at", "-id").values_list("id", flat=True)[: run.max_traces])


def _views(trace_ids: Sequence[int]) -> list[TraceView]:
    traces = {t["id"]: t for t in Trace.objects.filter(id__in=trace_ids).values("id", "deployment_id", "tools")}
    messages: dict[int, list[dict[str, Any]]] = {i: [] for i in trace_ids}
    rows = (
        Message.objects.filter(trace_id__in=trace_ids)
        .order_by("trace_id", "position")
        .values_list("trace_id", "role", "content", "tool_calls", "finish_reason", "raw")
    )
    for trace_id, role, content, tool_calls, finish_reason, raw in rows:
        m: dict[str, Any] = {"role": role, "content": content, "finish_reason": finish_reason}
        if tool_calls:
            m["tool_calls"] = tool_calls
        if isinstance(raw, dict) and raw.get("refusal"):
            m["refusal"] = raw["refusal"]
        messages[trace_id].append(m)
    return [
        TraceView(
            trace_id=i,
            messages=messages[i],
            tools=traces[i]["tools"] or [],
            group=str(traces[i]["deployment_id"]),
        )
        for i in trace_ids
        if i in traces
    ]


def _write_rule_flags(trace_ids: Sequence[int], findings: dict[int, list[Finding]], names: Sequence[str]) -> int:
    """Replace the scanned traces' rule flags of `names` by the current findings."""
    TraceFlag.objects.filter(trace_id__in=trace_ids, source=RULE_SOURCE, name__in=names).delete()
    started = _started_at(findings)
    flags = {}
    for trace_id, found in findings.items():
        for f in found:
            name = flag_name(f.kind)
            if name in names and (trace_id, name) not in flags:
                where = f"message #{f.position}: " if f.position is not None else ""
                flags[(trace_id, name)] = TraceFlag(
                    trace_id=trace_id,
                    name=name,
                    source=RULE_SOURCE,
                    detail=(where + f.detail)[:2000],
                    trace_started_at=started[trace_id],
                )
    # A flag of the same name a person set by hand is kept as it is.
    TraceFlag.objects.bulk_create(flags.values(), ignore_conflicts=True)
    return len(flags)


def _started_at(trace_ids: Iterable[int]) -> dict[int, datetime]:
    """Each trace's start, which its flags carry (the list walks flags newest first)."""
    return dict(Trace.objects.filter(id__in=list(trace_ids)).values_list("id", "started_at"))


def _praised_turns(trace_ids: Sequence[int]) -> set[tuple[int, int]]:
    """(message, person) pairs where the person rated the turn well: thumbs up or 4-5."""
    return set(
        TurnRating.objects.filter(trace_id__in=trace_ids)
        .filter(Q(kind=RatingKind.THUMBS, value__gt=0) | Q(kind=RatingKind.SCORE, value__gte=4))
        .values_list("message_id", "user_id")
    )


def _notes(trace_ids: Sequence[int]) -> list[dict[str, Any]]:
    """Operators' comments, and rationales of failing judgements, on the scanned traces,
    newest first (what people and the judge said went wrong). Only negative feedback is a
    failure note: a comment whose author rated the same turn well, or that only praises
    ("Great answer!"), is left out."""
    ids = list(trace_ids)
    praised = _praised_turns(ids)
    notes: list[dict[str, Any]] = []
    comments = (
        Comment.objects.filter(trace_id__in=ids)
        .order_by("-created_at")
        .values("id", "trace_id", "message_id", "author_id", "body")
    )
    for c in comments.iterator(chunk_size=2000):
        if len(notes) >= MAX_TEXTS:
            break
        if (c["message_id"], c["author_id"]) in praised or text_is_praise(c["body"]):
            continue
        notes.append({"trace_id": c["trace_id"], "comment_id": c["id"], "text": c["body"][:NOTE_CHARS]})
    room = MAX_TEXTS - len(notes)
    if room > 0:
        failing = (
            JudgeResult.objects.filter(trace_id__in=ids, is_latest=True, reward__lt=settings.JUDGE_PASS_THRESHOLD)
            .exclude(rationale="")
            .order_by("-created_at")
            .values("id", "trace_id", "rationale")[:room]
        )
        for r in failing:
            notes.append({"trace_id": r["trace_id"], "judge_result_id": r["id"], "text": r["rationale"][:NOTE_CHARS]})
    return notes


def _name(texts: list[str], others: list[str], endpoint: JudgeEndpoint | None) -> dict[str, str]:
    if endpoint is not None:
        try:
            named = name_cluster(texts=texts, endpoint=endpoint)
        except JudgeCallFailed as exc:
            error = exc.reason
        else:
            if name_is_readable(named.name.name):
                return {
                    "name": named.name.name,
                    "description": named.name.description,
                    "named_by": "judge",
                    "naming_error": "",
                    "judge_model": endpoint.model,
                    "prompt_version": named.prompt_version,
                }
            # The judge answered in the schema but with garbage: name the cluster after its
            # most representative comment instead, and keep what the judge said.
            readable = name_from_texts(texts)
            if readable:
                return {
                    "name": readable,
                    "description": "",
                    "named_by": "comments",
                    "naming_error": f"the judge's name was unreadable: {named.name.name[:200]!r}",
                    "judge_model": endpoint.model,
                    "prompt_version": named.prompt_version,
                }
            error = f"the judge's name was unreadable: {named.name.name[:200]!r}"
    else:
        error = "no judge endpoint is configured"
    return {
        "name": keyword_name(texts, others),
        "description": "",
        "named_by": "keywords",
        "naming_error": error,
        "judge_model": "",
        "prompt_version": "",
    }


def _cluster(
    run: FailureModeRun,
    trace_ids: Sequence[int],
    endpoint: JudgeEndpoint | None,
    embed: Callable[[Sequence[str]], np.ndarray] | None,
) -> int:
    notes = _notes(trace_ids)
    _progress(run, stage="embedding notes", notes_clustered=len(notes))
    TraceFlag.objects.filter(trace_id__in=trace_ids, source=CLUSTER_SOURCE).delete()
    if len(notes) < 3:
        return 0
    texts = [n["text"] for n in notes]
    embeddings = (embed or embed_texts)(texts)
    _progress(run, stage="clustering notes")
    labels = cluster_embeddings(embeddings)
    count = int(labels.max()) + 1
    _progress(run, stage="naming clusters", progress_done=0, progress_total=count)
    used: Counter[str] = Counter()
    flags = {}
    for rank in range(count):
        members = [int(i) for i in np.flatnonzero(labels == rank)]
        central = central_indices(embeddings, members, k=EXAMPLES)
        member_set = set(members)
        others = [texts[i] for i in range(len(texts)) if i not in member_set][:2000]
        naming = _name([texts[i] for i in central], others, endpoint)
        base = ("mode-" + slugify(naming["name"]))[:90].strip("-") or f"mode-{rank}"
        used[base] += 1
        slug = base if used[base] == 1 else f"{base}-{used[base]}"
        cluster = FailureCluster.objects.create(
            run=run,
            rank=rank,
            name=naming["name"][:100],
            flag_name=slug,
            description=naming["description"],
            named_by=naming["named_by"],
            naming_error=naming["naming_error"][:2000],
            judge_model=naming["judge_model"],
            prompt_version=naming["prompt_version"],
            size=len(members),
            trace_count=len({notes[i]["trace_id"] for i in members}),
            examples=[texts[i] for i in central],
        )
        FailureClusterMember.objects.bulk_create(
            FailureClusterMember(
                cluster=cluster,
                trace_id=notes[i]["trace_id"],
                comment_id=notes[i].get("comment_id"),
                judge_result_id=notes[i].get("judge_result_id"),
                text=texts[i],
            )
            for i in members
        )
        for i in members:
            key = (notes[i]["trace_id"], slug)
            flags.setdefault(
                key,
                TraceFlag(trace_id=key[0], name=slug, source=CLUSTER_SOURCE, detail=f"failure mode: {cluster.name}"),
            )
        _progress(run, progress_done=rank + 1)
    started = _started_at({trace_id for trace_id, _ in flags})
    for (trace_id, _), flag in flags.items():
        flag.trace_started_at = started[trace_id]
    TraceFlag.objects.bulk_create(flags.values(), ignore_conflicts=True)
    return count


def failure_mode_run_execute(
    *,
    run: FailureModeRun,
    endpoint: JudgeEndpoint | None = None,
    embed: Callable[[Sequence[str]], np.ndarray] | None = None,
    worker: str | None = None,
) -> FailureModeRun:
    """Run the pipeline. `endpoint` names clusters (default: the deployment's or the
    settings' judge; without one, clusters get keyword names). A run already finished
    is returned as it is; one found running (its worker died) starts over."""
    claimed = work_claim(
        FailureModeRun,
        pk=run.pk,
        worker=worker or work_worker_name(),
        resume_after=0,
        fields={"started_at": timezone.now(), "stage": "selecting traces", "error": ""},
    )
    if claimed is None:
        return _reread(run)
    run = claimed
    too_many = work_attempts_exceeded(run)
    if too_many:
        return _run_end(run, WorkStatus.FAILED, error=too_many)
    FailureCluster.objects.filter(run=run).delete()
    if endpoint is None:
        try:
            endpoint = judge_endpoint_for(deployment=run.deployment)
        except JudgeNotConfigured:
            endpoint = None
    try:
        trace_ids = _trace_ids(run)
        _progress(run, stage="detecting", progress_done=0, progress_total=len(trace_ids))
        findings: dict[int, list[Finding]] = {}
        finals: list[TraceView] = []
        per_trace = [n for n in RULE_FLAG_NAMES if n != flag_name(LENGTH_OUTLIER)]
        flags_written = 0
        for start in range(0, len(trace_ids), CHUNK):
            chunk = trace_ids[start : start + CHUNK]
            views = _views(chunk)
            # Length outliers need the whole batch: they are found after the loop, from
            # each trace's last answer kept here.
            found = {
                trace_id: [f for f in fs if f.kind != LENGTH_OUTLIER] for trace_id, fs in detect_batch(views).items()
            }
            found = {trace_id: fs for trace_id, fs in found.items() if fs}
            finals.extend(_final_only(v) for v in views)
            findings.update(found)
            flags_written += _write_rule_flags(chunk, found, per_trace)
            _progress(run, progress_done=min(start + CHUNK, len(trace_ids)))
        outliers = detect_length_outliers(finals)
        for trace_id, items in outliers.items():
            findings.setdefault(trace_id, []).extend(items)
        flags_written += _write_rule_flags(trace_ids, outliers, [flag_name(LENGTH_OUTLIER)])
        counts = Counter(flag_name(f.kind) for items in findings.values() for f in {x.kind: x for x in items}.values())
        _progress(
            run,
            traces_scanned=len(trace_ids),
            traces_flagged=len(findings),
            flags_written=flags_written,
            flag_counts=dict(counts),
        )
        _cluster(run, trace_ids, endpoint, embed)
    except _RunEnded:
        return _reread(run)
    except Exception as exc:
        logger.exception("failure-mode run %s failed", run.pk)
        return _run_end(run, WorkStatus.FAILED, error=f"{type(exc).__name__}: {exc}"[:5000])
    return _run_end(run, WorkStatus.FINISHED, stage="finished")


def _run_end(run: FailureModeRun, status: str, *, error: str | None = None, stage: str | None = None) -> FailureModeRun:
    """End the run if this worker still holds it; one the sweep ended first keeps its outcome."""

    def settle(row: FailureModeRun) -> list[str]:
        if stage is None:
            return []
        row.stage = stage
        return ["stage"]

    return work_end(FailureModeRun, pk=run.pk, worker=run.worker, status=status, error=error, settle=settle) or run


def _reread(run: FailureModeRun) -> FailureModeRun:
    """The row as it stands now (or as this worker last saw it, if it was deleted)."""
    return FailureModeRun.objects.filter(pk=run.pk).first() or run


def _final_only(view: TraceView) -> TraceView:
    answer = final_answer(view)
    if answer is None:
        return TraceView(trace_id=view.trace_id, messages=[], group=view.group)
    messages: list[dict[str, Any]] = [{"role": "user", "content": ""}] * answer[0]
    messages.append({"role": "assistant", "content": answer[1]})
    return TraceView(trace_id=view.trace_id, messages=messages, group=view.group)


@transaction.atomic
def failure_cluster_rename(*, cluster: FailureCluster, name: str) -> FailureCluster:
    """Give a failure mode a person's name: its flag on every trace is renamed with it (to
    `mode-<slug of the name>`), so the trace list filters by the new name."""
    name = (name or "").strip()
    if not name:
        raise FieldError("name", "required: what do these notes have in common?")
    if len(name) > 100:
        raise FieldError("name", f"{len(name)} characters; at most 100")
    slug = ("mode-" + slugify(name))[:90].strip("-")
    if slug == "mode":
        raise FieldError("name", "use some letters or digits")
    old = cluster.flag_name
    if slug != old:
        # A trace that already carries a flag of the new name keeps that one.
        taken = TraceFlag.objects.filter(name=slug).values("trace_id")
        TraceFlag.objects.filter(name=old, source=CLUSTER_SOURCE, trace_id__in=taken).delete()
        TraceFlag.objects.filter(name=old, source=CLUSTER_SOURCE).update(name=slug, detail=f"failure mode: {name}")
    else:
        TraceFlag.objects.filter(name=old, source=CLUSTER_SOURCE).update(detail=f"failure mode: {name}")
    cluster.name, cluster.flag_name, cluster.named_by = name, slug, "person"
    cluster.save(update_fields=["name", "flag_name", "named_by"])
    return cluster


@transaction.atomic
def failure_cluster_dismiss(*, cluster: FailureCluster, user, now: datetime | None = None) -> FailureCluster:
    """Not a failure mode: take its flag off its traces and mark it dismissed (a later run
    clusters the notes afresh)."""
    TraceFlag.objects.filter(name=cluster.flag_name, source=CLUSTER_SOURCE).delete()
    cluster.dismissed_at, cluster.dismissed_by = now or timezone.now(), user
    cluster.save(update_fields=["dismissed_at", "dismissed_by"])
    return cluster
