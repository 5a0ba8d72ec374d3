"""Evaluating a candidate on whole episodes: each episode item plays the task once with the
candidate and once with the baseline in the environment, and keeps each side's grade,
audit and a bounded transcript (`evaluation` runs the items)."""

from __future__ import annotations

from typing import Any

from training.environments import environment_get
from training.environments.episodes import Completion, episode_run
from training.promotion.evaluation.generate import GenerationError
from training.promotion.evaluation.metrics import compare, response_checks
from training.promotion.models import Evaluation, EvaluationItem
from training.serving.models import ModelVersion
from webapp.kernel.nul import strip_nul

TRANSCRIPT_MESSAGES = 40
TRANSCRIPT_CHARS = 2000


def _episode_task(source: dict[str, Any]):
    """The task an episode item names, from its environment (a fresh slice is generated
    again from its seed: the same seed gives the same tasks)."""
    env = environment_get(source["environment"])
    if source.get("fresh_seed") is not None:
        tasks = {t.id: t for t in env.tasks_fresh(seed=int(source["fresh_seed"]))}
        return env, tasks[source["task_id"]]
    return env, env.task(source["task_id"])


def _transcript(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the episode added after its opening, each message's text cut to a bound."""
    out = []
    for m in messages[:TRANSCRIPT_MESSAGES]:
        row = {k: v for k, v in m.items() if k in ("role", "name", "tool_call_id", "tool_calls")}
        content = m.get("content")
        row["content"] = content[:TRANSCRIPT_CHARS] if isinstance(content, str) else content
        out.append(row)
    return out


def episode_side_run(*, env, task, version: ModelVersion, generator, max_tokens: int) -> dict[str, Any]:
    """One version's whole episode of `task`: every turn generated as it would be served,
    its tool calls run in a fresh sandbox, then the grade and the audit of what it changed
    or named outside its task."""

    def complete(messages: list[dict[str, Any]], tools: list[dict[str, Any]], remaining: int) -> Completion:
        g = generator.generate(version, messages=messages, tools=tools or None, max_tokens=min(max_tokens, remaining))
        message = {k: v for k, v in g.message.items() if k != "role"}
        return Completion(message=message, tokens=max(1, len(g.token_ids)), finish_reason=g.finish_reason)

    episode = episode_run(env, task, complete)
    turns = [m for m in episode.messages if m.get("role") == "assistant"]
    checks = [
        response_checks(m, finish_reason=c.finish_reason, tools=task.tools)
        for m, c in zip(turns, episode.completions, strict=False)
    ]
    last = turns[-1] if turns else {"role": "assistant", "content": ""}
    graded = bool(task.hidden.get("graded", True))
    return {
        "episode": True,
        "message": last,
        "finish_reason": episode.completions[-1].finish_reason if episode.completions else "",
        "tokens": episode.tokens,
        "chars": sum(c["chars"] for c in checks),
        "tool_calls_seen": sum(c["tool_calls_seen"] for c in checks),
        "tool_calls_invalid": sum(c["tool_calls_invalid"] for c in checks),
        "empty": bool(checks) and checks[-1]["empty"],
        "refusal": any(c["refusal"] for c in checks),
        "truncated": any(c["truncated"] for c in checks),
        "graded": episode.reward if graded else None,
        "success": (episode.reward >= 1.0 - 1e-9) if graded else None,
        "reason": episode.grade.reason,
        "end": episode.end,
        "turns": len(turns),
        "tool_errors": episode.tool_errors,
        "collateral_changes": list(episode.audit.collateral_changes)[:50],
        "unknown_ids": list(episode.audit.unknown_ids)[:50],
        "policy_violations": list(episode.audit.policy_violations)[:50],
        "kind": str(task.hidden.get("kind") or ""),
        "kind_label": env.kinds.get(str(task.hidden.get("kind") or ""), ""),
        "transcript": _transcript(episode.messages[len(task.first_messages()) :]),
    }


def episode_item_run(*, item: EvaluationItem, evaluation: Evaluation, generator) -> None:
    """Both versions run the item's task as a whole episode; the outcome compares their
    grades. A generation error ends that side with an error, as for a single turn."""
    env, task = _episode_task(item.source)
    max_tokens = int(evaluation.config.get("max_tokens", 256))
    results: dict[str, dict[str, Any]] = {}
    for side, version in (("candidate", evaluation.candidate), ("baseline", evaluation.baseline)):
        try:
            results[side] = episode_side_run(
                env=env, task=task, version=version, generator=generator, max_tokens=max_tokens
            )
        except GenerationError as exc:
            results[side] = {"episode": True, "error": str(exc)[:2000]}
    cand, base = results["candidate"], results["baseline"]
    item.outcome = compare(cand.get("graded"), base.get("graded"))
    item.kl = None
    item.judge_error = ""
    # Generated text may hold U+0000, which PostgreSQL's jsonb cannot.
    item.candidate, item.baseline = strip_nul(cand), strip_nul(base)
    item.done = True
    item.save(update_fields=["candidate", "baseline", "outcome", "kl", "judge_error", "done"])
