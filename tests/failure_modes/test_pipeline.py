"""The failure-mode pipeline over a batch of 1,000 stored traces with seeded failures."""

from __future__ import annotations

import json
import random
import time
from collections import Counter

import pytest

from feedback.failure_modes.clustering import adjusted_rand_index
from feedback.failure_modes.services import failure_mode_run_create, failure_mode_run_execute
from feedback.models import Comment, FailureCluster, FailureClusterMember, FailureModeRun, Trace, TraceFlag
from feedback.services.ingest import traces_ingest
from tests.factories import DeploymentFactory, user_with_role
from tests.failure_modes.seeded import GROUPS, seeded_notes
from tests.fixtures.judge import Reply, user_prompt
from webapp.kernel.work import WorkStatus

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
                "additionalProperties": False,
            },
        },
    }
]
SEEDED = {
    "tool-error": 30,
    "invalid-tool-args": 30,
    "truncated": 30,
    "empty-answer": 20,
    "refusal": 20,
    "length-outlier": 20,
}


def conversation(i: int, kind: str | None, rng: random.Random) -> list[dict]:
    args = json.dumps({"order_id": f"A{i}"})
    result = json.dumps({"status": "shipped", "eta_days": rng.randint(1, 9)})
    answer = {
        "role": "assistant",
        "content": f"Order A{i} has shipped and should arrive within {rng.randint(2, 9)} days. "
        + "Thanks! " * rng.randint(0, 6),
    }
    if kind == "tool-error":
        result = '{"error": "order service unavailable"}'
    elif kind == "invalid-tool-args":
        args = rng.choice([json.dumps({"order_id": i}), "{}", '{"order_id": "A1", "force": true}', '{"order_id": "A1"'])
    elif kind == "truncated":
        answer["finish_reason"] = "length"
    elif kind == "empty-answer":
        answer["content"] = ""
    elif kind == "refusal":
        answer["content"] = "I'm sorry, but I can't help with that request."
    elif kind == "length-outlier":
        answer["content"] = "Here is everything about your order. " * 150
    return [
        {"role": "user", "content": f"Where is order A{i}?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "lookup_order", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": f"c{i}", "content": result},
        answer,
    ]


@pytest.fixture
def batch(db):
    rng = random.Random(42)
    deployment = DeploymentFactory(name="support-bot")
    kinds: list[str | None] = [k for k, n in SEEDED.items() for _ in range(n)]
    kinds += [None] * (1000 - len(kinds))
    rng.shuffle(kinds)
    items = [
        {"external_id": f"t{i}", "tools": TOOLS, "messages": conversation(i, kind, rng)} for i, kind in enumerate(kinds)
    ]
    results = traces_ingest(deployment=deployment, items=items)
    assert all(r.status == "created" for r in results)
    ids = {f"t{i}": r.trace_id for i, r in enumerate(results)}
    truth = {kind: {ids[f"t{i}"] for i, k in enumerate(kinds) if k == kind} for kind in SEEDED}

    # Seeded operator notes in known groups, on answers of clean traces.
    operator = user_with_role("operator", "olga")
    texts, groups = seeded_notes(30, seed=3)
    clean = [ids[f"t{i}"] for i, k in enumerate(kinds) if k is None]
    answers = dict(Trace.objects.filter(pk__in=clean).values_list("pk", "messages__id").filter(messages__position=3))
    targets = rng.sample(clean, len(texts))
    comments = Comment.objects.bulk_create(
        Comment(trace_id=t, message_id=answers[t], author=operator, body=text)
        for t, text in zip(targets, texts, strict=True)
    )
    note_group = {c.pk: g for c, g in zip(comments, groups, strict=True)}
    return deployment, truth, note_group, clean


def namer(request):
    """The judge names a cluster after the group most of its shown notes come from."""
    prompt = user_prompt(request)
    votes = Counter()
    for group, templates in GROUPS.items():
        for template in templates:
            head = template.split("{")[0][:25]
            if head and head in prompt:
                votes[group] += prompt.count(head)
    group = votes.most_common(1)[0][0] if votes else "unknown"
    return {"name": group.capitalize(), "description": f"Notes about {group}."}


def test_seeded_failures_are_flagged_and_notes_clustered_into_their_groups(batch, judge_settings):
    deployment, truth, note_group, clean = batch
    judge_settings.respond_with(namer)
    run = failure_mode_run_create(deployment=deployment, max_traces=5000)
    started = time.perf_counter()
    failure_mode_run_execute(run=run)
    elapsed = time.perf_counter() - started
    run.refresh_from_db()
    assert run.status == WorkStatus.FINISHED, run.error
    assert run.traces_scanned == 1000 and run.progress_done == run.progress_total

    for name, expected in truth.items():
        flagged = set(TraceFlag.objects.filter(name=name, source="rule").values_list("trace_id", flat=True))
        assert flagged == expected, (name, len(flagged - expected), len(expected - flagged))
    assert not TraceFlag.objects.filter(trace_id__in=clean, source="rule").exists()
    assert run.flag_counts == SEEDED
    assert run.traces_flagged == sum(SEEDED.values())

    members = FailureClusterMember.objects.filter(cluster__run=run).values_list("comment_id", "cluster__rank")
    truth_labels, predicted = zip(*[(note_group[c], rank) for c, rank in members], strict=True)
    ari = adjusted_rand_index(truth_labels, predicted)
    clusters = list(FailureCluster.objects.filter(run=run))
    print(
        f"\nfailure-mode run over 1000 traces: {elapsed:.1f} s; {len(note_group)} seeded notes in "
        f"{len(GROUPS)} groups -> {len(clusters)} clusters, adjusted Rand index {ari:.3f}"
    )
    assert ari >= 0.8
    assert {c.name.lower() for c in clusters} == set(GROUPS)
    assert all(c.named_by == "judge" for c in clusters)
    rude = next(c for c in clusters if c.name == "Rude tone")
    assert TraceFlag.objects.filter(name=rude.flag_name, source="cluster").count() == rude.trace_count > 0

    # Running again replaces, it does not duplicate.
    again = failure_mode_run_create(deployment=deployment, max_traces=5000)
    failure_mode_run_execute(run=again)
    assert TraceFlag.objects.filter(source="rule").count() == sum(SEEDED.values())
    assert TraceFlag.objects.filter(source="cluster").count() == rude.trace_count + sum(
        c.trace_count for c in clusters if c.pk != rude.pk
    )


def test_a_cluster_the_judge_cannot_name_gets_a_keyword_name(batch, judge_settings, client):
    deployment = batch[0]
    judge_settings.respond_with(lambda request: Reply.text("no idea"))
    run = FailureModeRun.objects.create(deployment=deployment, max_traces=300)
    failure_mode_run_execute(run=run)
    run.refresh_from_db()
    assert run.status == WorkStatus.FINISHED
    clusters = list(FailureCluster.objects.filter(run=run))
    assert clusters and all(c.named_by == "keywords" and "not JSON" in c.naming_error for c in clusters)

    client.force_login(user_with_role("operator", "otto"))
    page = client.get("/failure-modes/").content.decode()
    assert "named from keywords" in page
    assert "/traces/?flag=tool-error" in page
    listing = client.get("/traces/?flag=tool-error").content.decode()
    flagged = Trace.objects.filter(flags__name="tool-error").first()
    assert f">{flagged.external_id}<" in listing
