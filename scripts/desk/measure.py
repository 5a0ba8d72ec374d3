"""Episodes of the support desk played under the harness, and their figures."""

from __future__ import annotations

import json
import time
from typing import Any

from desk import log
from desk.harness import Harness


def first_call_other(episode) -> bool:
    """The episode's first tool call names another order than the customer's."""
    order = str(episode.task.hidden["order_id"]).upper()
    for message in episode.messages:
        for call in message.get("tool_calls") or []:
            try:
                arguments = json.loads((call.get("function") or {}).get("arguments") or "{}")
            except ValueError:
                return True
            return str(arguments.get("order_id", "")).strip().upper() != order
    return False


def measure(harness: Harness, tasks, *, seed: int, label: str) -> dict[str, Any]:
    """Play each task once (episode i seeded with seed·100003 + i): rates and their counts."""
    harness.model.eval()
    rows = []
    started = time.time()
    for start in range(0, len(tasks), 16):
        episodes = harness.episodes(tasks[start : start + 16], seed=seed * 1_000 + start)
        for episode in episodes:
            rows.append(
                {
                    "task": episode.task.id,
                    "refund": episode.task.hidden["refund"],
                    "success": episode.reward >= 1.0,
                    "kind": episode.task.hidden.get("kind", ""),
                    "collateral": bool(episode.audit.collateral_changes),
                    "violations": bool(episode.audit.policy_violations),
                    "unknown_ids": bool(episode.audit.unknown_ids),
                    "first_call_other": first_call_other(episode),
                    "end": episode.end,
                    "transcript": [m.get("content") or json.dumps(m.get("tool_calls")) for m in episode.messages[2:]][
                        :8
                    ],
                }
            )
        done = sum(r["success"] for r in rows)
        log(f"  {label}: {len(rows)}/{len(tasks)} episodes, {done} succeeded ({time.time() - started:.0f} s)")
    n = len(rows)
    summary = {
        "n": n,
        "successes": sum(r["success"] for r in rows),
        "collateral": sum(r["collateral"] for r in rows),
        "violations": sum(r["violations"] for r in rows),
        "unknown_ids": sum(r["unknown_ids"] for r in rows),
        "first_call_other": sum(r["first_call_other"] for r in rows),
        "refundable_refunded": sum(r["success"] for r in rows if r["refund"]),
        "refundable": sum(1 for r in rows if r["refund"]),
        "others_left_alone": sum(r["success"] for r in rows if not r["refund"]),
        "others": sum(1 for r in rows if not r["refund"]),
        "seconds": round(time.time() - started, 1),
    }
    summary["success_rate"] = summary["successes"] / n
    summary["collateral_rate"] = summary["collateral"] / n
    summary["violation_rate"] = summary["violations"] / n
    summary["unknown_id_rate"] = summary["unknown_ids"] / n
    summary["episodes"] = rows
    return summary


def eval_tasks(*, split: str, episodes: int, seed: int, fresh_seed: int | None = None):
    """`episodes` graded tasks of `split`, the same for a base and a candidate of one seed."""
    from training.environments.support_desk import tasks_sample

    return tasks_sample(split=split, count=episodes, seed=10_000 + seed, graded_share=1.0, fresh_seed=fresh_seed)


def slim(m: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in m.items() if k != "episodes"}
