"""`bench/gateway.py --split`: the gateway's added latency while a progressive release splits a
deployment's traffic, against the same gateway without a split, side by side.

Two deployments on the same stub upstream, both stitching conversations: `bench` serves its
live version alone, `bench-split` routes 25 % of its conversations (by the hash of each one's
opening, as a harness without a session id is routed) to a candidate. The same conversations go
to each deployment and straight to the upstream, one call to each in turn, so the machine's
drift touches all three alike. Printed: p50 and p90 of each, the added p50 (gateway minus
direct) and the median paired gap, and the ratio of the split's added latency to the plain
one's (the goal: within 10 %, a ratio up to 1.10).
"""

from __future__ import annotations

import json
from pathlib import Path

SHARE = 0.25


def split_deployment(model_dir: Path) -> str:
    """`bench-split`, live on the bench model, with a LoRA candidate taking `SHARE` of its
    conversations (django is set up by `create_deployment`); returns its API key."""
    from feedback.services.api_keys import api_key_create
    from training.serving.models import ModelVersion
    from training.serving.services import deployment_get_or_create, live_version_set, model_version_create
    from training.serving.splits import canary_split_set

    live = ModelVersion.objects.get(name="bench-model")
    adapter = model_dir.parent / "bench-candidate"
    adapter.mkdir(parents=True, exist_ok=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))  # never loaded
    candidate = model_version_create(
        name="bench-candidate", base_model=live.base_model, kind="lora", path=adapter, parent=live
    )
    dep = deployment_get_or_create(name="bench-split")
    live_version_set(deployment=dep, version=live)
    canary_split_set(deployment=dep, version=candidate, share=SHARE, rollout_id=1)
    return api_key_create(deployment=dep, scopes=["ingest"]).plaintext


def split_report(times: dict[str, list[float]], ms) -> None:
    direct = times["direct"]
    added = {}
    for name in ("split", "plain", "direct"):
        t = times[name]
        gaps = [a - b for a, b in zip(t, direct, strict=True)]
        added[name] = ms(gaps)
        print(f"  {name:32} {ms(t):>8.3f} {ms(t, 0.9):>8.3f} {ms(t) - ms(direct):>10.3f} {ms(gaps):>15.3f}")
    ratio = added["split"] / added["plain"] if added["plain"] > 0 else float("nan")
    verdict = "within" if ratio <= 1.10 else "beyond"
    print(
        f"  added latency with a {SHARE:.0%} split / without: {ratio:.3f} (median paired gaps "
        f"{added['split']:.3f} / {added['plain']:.3f} ms): {verdict} the 10 % goal"
    )


def split_served(db_url: str) -> str:
    """How `bench-split`'s conversations were served, from the logged traces."""
    import psycopg

    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT v.name, count(*) FROM feedback_trace t JOIN feedback_deployment d ON d.id = t.deployment_id"
            " JOIN training_modelversion v ON v.id = t.model_version_id WHERE d.name = 'bench-split' GROUP BY v.name"
            " ORDER BY v.name"
        ).fetchall()
    total = sum(n for _, n in rows) or 1
    return ", ".join(f"{name} {n} ({n / total:.0%})" for name, n in rows)


def lookup_report(messages_of, calls: int) -> None:
    """What a gateway process that never routed a conversation pays on its next call: the
    trace store's answer to "which version served it?" (`served_version_sync`), timed for the
    split deployment's continuing calls of the latency run (a session or a named trace id is
    one indexed row; a stitched call, one or two tip lookups)."""
    import statistics
    import time

    from feedback.gateway.pins import served_version_sync
    from feedback.models import ApiKey
    from training.serving.models import Deployment
    from webapp.kernel.chat_format import parse_message

    dep = Deployment.objects.get(name="bench-split")
    key_id = ApiKey.objects.get(deployment=dep).pk
    times, found = [], 0
    for i in range(calls):
        raw = messages_of(i)
        if not any(m["role"] == "assistant" for m in raw):
            continue
        messages = [parse_message(m, "m") for m in raw]
        t0 = time.perf_counter()
        version = served_version_sync(
            deployment_id=dep.pk, session="", trace_key=None, api_key_id=key_id, messages=messages
        )
        times.append(time.perf_counter() - t0)
        found += version is not None
    times.sort()
    print(
        f"  a process that never routed the conversation asks the trace store once: p50 "
        f"{statistics.median(times) * 1000:.3f} ms, p90 {times[int(0.9 * len(times))] * 1000:.3f} ms "
        f"({found} of {len(times)} continuing calls found their version)"
    )
