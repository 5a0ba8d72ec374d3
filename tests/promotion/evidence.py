"""Evaluations stored with the figures the measurement produces, for the pages and checks
that read them: per-item results as `evaluation_item_run` / `episode_side_run` write them
(each episode side with its task's `kind` and its `policy_violations`), and the summary that
`training.promotion.evaluation.metrics.summarize` makes of them.

Two candidates from the issue that asked for honest evidence:

- `refund_everything`: the tour's candidate that learned "refund every delivered order" —
  right on refundable deliveries, wrong on late ones, where it refunds what the policy
  forbids (test split, 3 seeds, 144 episodes: success 78 → 97, violations 2 → 31).
- `demo_like`: the small evaluation the tour's demo makes — 3 hand-picked traces whose
  answers were all empty and cut off (the judge scored nothing), 6 whole episodes.

"""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from training.promotion.evaluation.metrics import summarize, wilson_interval

KIND_LABELS = {
    "refundable_recent": "refundable, delivered ≤ 21 days ago",
    "refundable_near_line": "refundable, delivered 22-30 days ago",
    "late_near_line": "late, delivered 31-40 days ago",
    "long_past": "late, delivered > 40 days ago",
    "not_delivered": "shipped, processing or already refunded",
}

# (kind, episodes, live right, candidate right): the table, 3 seeds of the test split.
REFUND_EVERYTHING = [
    ("refundable_recent", 55, 5, 41),
    ("refundable_near_line", 15, 1, 13),
    ("late_near_line", 19, 18, 5),
    ("long_past", 20, 19, 3),
    ("not_delivered", 35, 35, 35),
]
REFUND_KINDS = ("refundable_recent", "refundable_near_line")


def share(count: int, n: int) -> dict[str, Any]:
    low, high = wilson_interval(count, n)
    return {"rate": count / n if n else None, "count": count, "n": n, "ci_low": low, "ci_high": high}


def episode_side(*, success: bool, kind: str, violations: list[str] | None = None, **extra) -> dict[str, Any]:
    """One version's result of one whole episode, as `episode_side_run` stores it."""
    return {
        "episode": True,
        "kind": kind,
        "kind_label": KIND_LABELS.get(kind, kind),
        "message": {"role": "assistant", "content": "Done." if success else "Sorry."},
        "finish_reason": "stop",
        "tokens": 24,
        "chars": 60,
        "tool_calls_seen": 2,
        "tool_calls_invalid": 0,
        "empty": False,
        "refusal": False,
        "truncated": False,
        "graded": 1.0 if success else 0.0,
        "success": success,
        "reason": "the task's expected outcome" if success else "not the task's expected outcome",
        "end": "reply",
        "turns": 2,
        "tool_errors": 0,
        "collateral_changes": [],
        "unknown_ids": [],
        "policy_violations": list(violations or []),
        "transcript": [],
        **extra,
    }


def summary_of(items: list[dict[str, Any]]) -> dict[str, Any]:
    return summarize(items)


def evaluation_store(
    candidate, deployment, baseline, items, *, status="finished", extra=None, sources=None, config=None
):
    """The evaluation and its items, stored as a finished run leaves them (or `status`, its
    items not yet done and no summary)."""
    from training.promotion.models import Evaluation, EvaluationItem

    finished = status == "finished"
    evaluation = Evaluation.objects.create(
        deployment=deployment,
        candidate=candidate,
        baseline=baseline,
        status=status,
        total=len(items),
        done=len(items) if finished else 0,
        started_at=timezone.now(),
        finished_at=timezone.now() if finished else None,
        config=config or {"generator": "vllm", "max_tokens": 48, "temperature": 0.0},
        sources=sources or {},
        summary={**summary_of(items), **(extra or {})} if finished else {},
    )
    EvaluationItem.objects.bulk_create(
        EvaluationItem(
            evaluation=evaluation,
            position=k,
            kind=item.get("kind", "episode"),
            key=item["key"],
            source=item.get("source", {}),
            messages=item.get("messages", [{"role": "user", "content": item["key"]}]),
            done=finished,
            candidate=item["candidate"] if finished else {},
            baseline=item["baseline"] if finished else {},
            outcome=item.get("outcome", "") if finished else "",
        )
        for k, item in enumerate(items)
    )
    return evaluation


def evaluation_finish(evaluation, items, *, extra=None):
    """Finish a stored evaluation with its figures (the run is tested elsewhere)."""
    evaluation.status = "finished"
    evaluation.done = len(items)
    evaluation.finished_at = timezone.now()
    evaluation.summary = {**summary_of(items), **(extra or {})}
    evaluation.save(update_fields=["status", "done", "finished_at", "summary"])
    for k, item in enumerate(items):
        evaluation.items.filter(position=k).update(
            done=True, candidate=item["candidate"], baseline=item["baseline"], outcome=item.get("outcome", "")
        )
    return evaluation


def _outcome(cand: bool, live: bool) -> str:
    return "tie" if cand == live else ("win" if cand else "loss")


def refund_everything_items() -> list[dict[str, Any]]:
    """144 episodes of the test split (3 seeds), per the issue's table: the candidate refunds
    every delivered order, so it is right on refundable deliveries and wrong on late ones, where
    each wrong answer is a refund the policy forbids; the live version rarely refunds at all."""
    items = []
    for kind, n, live_right, cand_right in REFUND_EVERYTHING:
        late = kind not in REFUND_KINDS and kind != "not_delivered"
        for i in range(n):
            cand_ok, live_ok = i < cand_right, i < live_right
            refund = [f"order ORD-{i}: refunded against the policy"]
            items.append(
                {
                    "key": f"support-desk:{kind}:{i}",
                    "source": {"environment": "support-desk", "split": "test", "task_id": f"{kind}-{i}"},
                    "candidate": episode_side(
                        success=cand_ok, kind=kind, violations=refund if late and not cand_ok else []
                    ),
                    "baseline": episode_side(
                        success=live_ok, kind=kind, violations=refund if late and not live_ok else []
                    ),
                    "outcome": _outcome(cand_ok, live_ok),
                }
            )
    return items


def refund_curve() -> dict[str, Any]:
    """P(refund) after a lookup of a delivered order, by days since delivery, as the decision
    curve gives it: the candidate refunds at every age, the live version hardly ever."""
    days = list(range(0, 61, 5))
    return {
        "x_label": "days since delivery",
        "series": {
            "candidate": [[d, 0.92 if d <= 40 else 0.85, 12] for d in days],
            "live": [[d, 0.08 if d <= 30 else 0.04, 12] for d in days],
        },
        "rule": {"threshold": 30},
    }


REFUND_GAIN = {"mean": 0.132, "ci_low": -0.039, "ci_high": 0.294, "method": "task-bootstrap", "tasks": 64, "seeds": 3}


def demo_like_items() -> list[dict[str, Any]]:
    """The tour demo's evaluation: 3 hand-picked traces, both versions' answers empty and cut
    off at 16 tokens (the judge scored every one 0), then 6 support-desk episodes, 4 of them
    right for the candidate and 3 for the live version."""
    blank = {
        "message": {"role": "assistant", "content": ""},
        "finish_reason": "length",
        "tokens": 16,
        "chars": 0,
        "tool_calls_seen": 0,
        "tool_calls_invalid": 0,
        "empty": True,
        "refusal": False,
        "truncated": True,
        "reward": 0.0,
        "reason": "no answer",
    }
    items = [
        {"kind": "turn", "key": f"trace:{k}", "candidate": dict(blank), "baseline": dict(blank), "outcome": "tie"}
        for k in (11, 12, 13)
    ]
    kinds = [
        "refundable_recent",
        "refundable_near_line",
        "late_near_line",
        "long_past",
        "not_delivered",
        "refundable_recent",
    ]
    for k, kind in enumerate(kinds):
        cand_ok, live_ok = k < 4, k < 3
        items.append(
            {
                "key": f"support-desk:{kind}:{k}",
                "source": {"environment": "support-desk", "split": "test", "task_id": f"{kind}-{k}"},
                "candidate": episode_side(success=cand_ok, kind=kind),
                "baseline": episode_side(success=live_ok, kind=kind),
                "outcome": _outcome(cand_ok, live_ok),
            }
        )
    return items


ENVIRONMENT = {"environment": {"name": "support-desk", "split": "test", "tasks": 6}}
