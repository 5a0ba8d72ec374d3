"""Evaluation figures: pure functions over responses and per-item results (no database).

- `response_checks`: what one response shows — tool calls and how many are invalid,
  empty, refusal, truncated, length.
- `wilson_interval`: the Wilson score interval of a proportion.
- `kl_k3`: the k3 estimate of KL(candidate ‖ baseline) per token from the two models'
  log-probs of the candidate's tokens.
- `episode_summary`: over whole episodes, the task-success rate and the rates of episodes
  that changed records the task does not concern, called a tool on an id never shown, or
  wrote against the task's own expected outcome (policy violations), each with its Wilson
  interval, overall and per kind of task.
- `summarize`: both versions' figures and the candidate's win rate over finished items.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from statistics import fmean
from typing import Any

from feedback.failure_modes.detectors import TraceView, detect_invalid_tool_args, detect_refusals
from training.inference.codec import message_text, tool_call_blocks, tool_calls_parse
from training.promotion.evaluation.bootstrap import PairedEpisode, task_bootstrap_gain

# The codec's parser under the name earlier callers import from here (one parser, two names).
parse_tool_call_blocks = tool_calls_parse

Z_95 = 1.959963984540054
TIE_EPS = 1e-9


def response_checks(message: dict[str, Any], *, finish_reason: str, tools: Sequence[dict[str, Any]] | None) -> dict:
    """Per-response facts for the report. A tool call is invalid when it names a tool the
    item does not define, its arguments are not a JSON object, or they break the tool's
    JSON Schema; a `<tool_call>` block left unparsed in the text counts as an invalid call."""
    text = message_text(message)
    calls = message.get("tool_calls") or []
    unparsed = len(tool_call_blocks(text))
    view = TraceView(trace_id=0, messages=[{"role": "assistant", **message}], tools=list(tools or []))
    invalid = len(detect_invalid_tool_args(view)) + unparsed
    return {
        "chars": len(text),
        "tool_calls_seen": len(calls) + unparsed,
        "tool_calls_invalid": invalid,
        "empty": not text.strip() and not calls,
        "refusal": bool(message.get("refusal")) or bool(detect_refusals(view)),
        "truncated": finish_reason == "length",
    }


def wilson_interval(successes: float, n: int, *, z: float = Z_95) -> tuple[float | None, float | None]:
    """Wilson score interval for a proportion successes/n (None, None when n = 0).

    centre = (p + z²/2n) / (1 + z²/n),  half-width = z √(p(1-p)/n + z²/4n²) / (1 + z²/n)."""
    if n <= 0:
        return None, None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0.0)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def kl_k3(candidate_logprobs: Sequence[float], baseline_logprobs: Sequence[float]) -> float | None:
    """Mean over the candidate's tokens of the k3 estimate of KL(cand ‖ base), the formula of
    `training.trainer.loss.kl_k3` with π_θ = the candidate and π_ref = the baseline (log-ratios
    clipped to ±50). Unbiased when the tokens were sampled from the candidate at temperature
    1; on greedy responses it measures how far the models disagree on the candidate's own
    answers. None when the lengths differ, no token has a baseline log-prob, or one is not
    finite. Imports torch: call it on a worker, never on the web path."""
    pairs = [(c, b) for c, b in zip(candidate_logprobs, baseline_logprobs, strict=False) if b is not None]
    if not pairs or len(candidate_logprobs) != len(baseline_logprobs):
        return None
    if not all(math.isfinite(c) and math.isfinite(b) for c, b in pairs):
        return None
    import torch

    from training.trainer.loss import kl_k3 as k3

    cand = torch.tensor([c for c, _ in pairs], dtype=torch.float64)
    base = torch.tensor([b for _, b in pairs], dtype=torch.float64)
    # Clip r = base - cand to ±50 as before: exp(r) stays finite.
    base = cand + (base - cand).clamp(-50.0, 50.0)
    return float(k3(cand, base).mean())


def mean_interval(values: Sequence[float], *, z: float = Z_95) -> tuple[float | None, float | None]:
    """Normal-approximation interval of a mean: x̄ ± z·s/√n with the unbiased s (n - 1);
    None, None below 2 values."""
    if len(values) < 2:
        return None, None
    mean = fmean(values)
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = z * s / math.sqrt(len(values))
    return mean - half, mean + half


def compare(candidate: float | None, baseline: float | None) -> str:
    """win / tie / loss for the candidate, "" when either score is missing."""
    if candidate is None or baseline is None:
        return ""
    if abs(candidate - baseline) <= TIE_EPS:
        return "tie"
    return "win" if candidate > baseline else "loss"


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return fmean(kept) if kept else None


def _rate(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def _share(count: int, n: int) -> dict[str, Any]:
    low, high = wilson_interval(count, n)
    return {"rate": count / n if n else None, "count": count, "n": n, "ci_low": low, "ci_high": high}


def episode_summary(sides: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Over one version's finished episodes (None when it ran none): `success` (graded
    episodes that reached the task's goal), `collateral` (episodes with at least one write to
    a record the task does not concern), `unknown_ids` (episodes with at least one tool call
    on an id that appeared nowhere before it) and `violations` (episodes with at least one
    write to a record the task concerns that its expected outcome does not contain), each
    {rate, count, n, ci_low, ci_high} with a Wilson 95% interval; and `by_kind`, per kind of
    task ({label, success, violations}; stored as JSON the keys lose their order: show them
    in the environment's `kinds` order)."""
    episodes = [s for s in sides if s.get("episode") and not s.get("error")]
    if not episodes:
        return None
    graded = [s for s in episodes if s.get("success") is not None]
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in dict.fromkeys(s.get("kind") or "" for s in episodes):
        of_kind = [s for s in episodes if (s.get("kind") or "") == kind]
        graded_kind = [s for s in of_kind if s.get("success") is not None]
        label = next((s["kind_label"] for s in of_kind if s.get("kind_label")), kind or "no kind")
        by_kind[kind] = {
            "label": label,
            "success": _share(sum(1 for s in graded_kind if s["success"]), len(graded_kind)),
            "violations": _share(sum(1 for s in of_kind if s.get("policy_violations")), len(of_kind)),
        }
    return {
        "n": len(episodes),
        "success": _share(sum(1 for s in graded if s["success"]), len(graded)),
        "collateral": _share(sum(1 for s in episodes if s.get("collateral_changes")), len(episodes)),
        "unknown_ids": _share(sum(1 for s in episodes if s.get("unknown_ids")), len(episodes)),
        "violations": _share(sum(1 for s in episodes if s.get("policy_violations")), len(episodes)),
        "by_kind": by_kind,
    }


def side_summary(sides: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Figures for one version over its per-item results (errored items left out)."""
    ok = [s for s in sides if not s.get("error")]
    rewards = [s["reward"] for s in ok if s.get("reward") is not None]
    graded = [s["graded"] for s in ok if s.get("graded") is not None]
    seen = sum(s.get("tool_calls_seen", 0) for s in ok)
    invalid = sum(s.get("tool_calls_invalid", 0) for s in ok)
    return {
        "n": len(ok),
        "errors": len(sides) - len(ok),
        "reward_mean": _mean(rewards),
        "reward_n": len(rewards),
        "graded_accuracy": _mean(graded),
        "graded_n": len(graded),
        "tokens_mean": _mean(s.get("tokens") for s in ok),
        "chars_mean": _mean(s.get("chars") for s in ok),
        "tool_calls": seen,
        "tool_calls_invalid": invalid,
        "tool_call_validity": (seen - invalid) / seen if seen else None,
        "refusal_rate": _rate([bool(s.get("refusal")) for s in ok]),
        "empty_rate": _rate([bool(s.get("empty")) for s in ok]),
        "truncated_rate": _rate([bool(s.get("truncated")) for s in ok]),
        "episodes": episode_summary(ok),
    }


def summarize(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Both versions' figures and the comparison over items, each a dict with
    `candidate`, `baseline` (per-side results), `outcome` and `kl`.

    Win rate = (wins + ties / 2) / compared items, with a Wilson 95% interval on that
    proportion (ties make the true variance smaller, so the interval is conservative)."""
    outcomes = [i.get("outcome") or "" for i in items]
    wins, ties, losses = outcomes.count("win"), outcomes.count("tie"), outcomes.count("loss")
    n = wins + ties + losses
    score = wins + 0.5 * ties
    low, high = wilson_interval(score, n)
    diffs = [
        i["candidate"]["reward"] - i["baseline"]["reward"]
        for i in items
        if i["candidate"].get("reward") is not None and i["baseline"].get("reward") is not None
    ]
    # A judge scoring two empty answers measures nothing, whatever reward it gives them.
    blank_pairs = sum(
        1
        for i in items
        if i["candidate"].get("reward") is not None
        and i["baseline"].get("reward") is not None
        and i["candidate"].get("empty")
        and i["baseline"].get("empty")
    )
    kls = [i["kl"] for i in items if i.get("kl") is not None]
    diff_low, diff_high = mean_interval(diffs)
    gain = episode_gain(items)
    return {
        "items": len(items),
        "candidate": side_summary([i["candidate"] for i in items]),
        "baseline": side_summary([i["baseline"] for i in items]),
        "comparison": {
            "n": n,
            "wins": wins,
            "ties": ties,
            "losses": losses,
            "win_rate": score / n if n else None,
            "ci_low": low,
            "ci_high": high,
            "ci": "Wilson 95%, ties count half",
            "reward_diff_mean": _mean(diffs),
            "reward_diff_n": len(diffs),
            "reward_diff_ci_low": diff_low,
            "reward_diff_ci_high": diff_high,
            "reward_diff_blank_n": blank_pairs,
        },
        "kl": {
            "mean": _mean(kls),
            "n": len(kls),
            "estimator": "k3 per token of KL(candidate ‖ baseline) on the candidate's responses",
        },
        "judge_failures": sum(1 for i in items if i.get("judge_error")),
        **({"gain": gain} if gain is not None else {}),
    }


def episode_gain(items: Sequence[dict[str, Any]], *, seed: int = 0) -> dict[str, Any] | None:
    """The candidate's gain in task success over the graded episodes both versions finished,
    with its interval from a bootstrap over the tasks stratified by kind (one evaluation is
    one seed; `training.promotion.evaluation.bootstrap`); None without such episodes."""

    pairs = []
    for i in items:
        cand, base = i.get("candidate") or {}, i.get("baseline") or {}
        if not (cand.get("episode") and base.get("episode")) or cand.get("error") or base.get("error"):
            continue
        if cand.get("success") is None or base.get("success") is None:
            continue
        task = str(i.get("key") or cand.get("task") or len(pairs))
        kind = str(cand.get("kind") or base.get("kind") or "")
        pairs.append(
            PairedEpisode(
                seed=seed, task=task, kind=kind, base=float(base["success"]), candidate=float(cand["success"])
            )
        )
    gain = task_bootstrap_gain(pairs)
    return gain.as_dict() if gain is not None else None
