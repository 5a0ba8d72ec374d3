"""How many actions does a reader choose right from comments no template wrote?

The reader is a judge in "actions" mode, called through the product's own path
(`feedback.judge.scoring.judge_turn_action`: the judge-action prompt, the action-space schema
sent as `response_format` with the conversation's ids as the only ids allowed, the parser and
its re-ask). Each case is a support-desk decision context (right after the lookup), the turn
the comment is about, and one phrasing of the comment bank
(`training/environments/data/comment_bank.json`, written apart from the simulated lead, for
evaluation only). The logged turn is the opposite of what the comment asks (of what the
policy calls for, under a vague comment), so the comment always asks for a change.

Counted right: on a specific or a wrong comment, the action the comment asks for (a refund
call on the customer's order id, or a reply); on a vague one, the policy's action (the words
do not say it). Nothing is trained. The contexts are the validation split's, where a reader
is chosen; `--split test` reads the test split's, a look checked and logged as for a recipe
(`docs/experiments/test-split-looks.jsonl`, `--second-look REASON` for another).

    .venv/bin/python scripts/reader_bank.py                       # SmolLM2-135M-Instruct, vLLM on CPU
    .venv/bin/python scripts/reader_bank.py --model var/judges/qwen2.5-coder-1.5b-instruct
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def logged_turn(order_id: str, action: str) -> dict:
    if action == "refund":
        arguments = json.dumps({"order_id": order_id})
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "issue_refund", "arguments": arguments}}
            ],
        }
    return {"role": "assistant", "content": "I am sorry, this order cannot be refunded."}


def bank_contexts(
    *, split: str, seed: int, family: str, script: str, argv: list[str], second_look: str, looks_log, take: bool = True
):
    """The support desk's decision contexts of `split` for the bank's comments. Reading the
    test split's is a look at it (a reader, or a way to serve one, may be chosen from what
    it reads), logged in `looks_log` (`split_looks`) as `family` as the contexts are read,
    so once the reader is up: a second look at the family needs `second_look`, its reason,
    whatever the seed (`--seed` only deals the same test contexts to the comments another
    way). `take=False`: the check alone, before anything starts (`SecondLook`), reading
    nothing. Choose on the validation split, the default."""
    from training.environments.support_desk import SupportDesk

    if split == "test" and looks_log is not None:
        from training.promotion.evaluation.split_looks import split_look_check, split_look_take

        if not take:
            split_look_check(family=family, reason=second_look, path=looks_log)
            return []
        split_look_take(
            family=family,
            script=script,
            argv=argv,
            seeds=[seed],
            reason=second_look,
            path=looks_log,
            per_seed=False,
        )
    if not take:
        return []
    desk = SupportDesk()
    return desk.decision_contexts(tasks=desk.tasks_for(split=split, graded=True), per_point=1)


def split_arguments(p: argparse.ArgumentParser) -> None:
    """`--split`, `--second-look` and `--looks-log`, as this script and bench/judge_runtime.py take them."""
    from training.promotion.evaluation.split_looks import LOG

    p.add_argument(
        "--split",
        default="validation",
        choices=["validation", "test"],
        help="whose decision contexts: test is a look at the test split, logged (and refused a second time)",
    )
    p.add_argument("--second-look", default="", metavar="REASON", help="read the test split again, with the reason")
    p.add_argument("--looks-log", type=Path, default=LOG, help="where a look at the test split is checked and logged")


def read_one(case, *, endpoint) -> dict:
    from feedback.judge.client import JudgeCallFailed
    from feedback.judge.prompts import FeedbackItem
    from feedback.judge.scoring import judge_turn_action

    row = json.loads(case.context.messages[-1]["content"])
    order_id = row["order_id"]
    wanted = case.asks or case.right
    logged = logged_turn(order_id, "reply" if wanted == "refund" else "refund")
    started = time.monotonic()
    action, error, attempts = None, "", 0
    try:
        outcome = judge_turn_action(
            context=case.context.messages,
            turn=logged,
            feedback=[FeedbackItem(kind="operator comment", text=case.body)],
            endpoint=endpoint,
            tools=case.context.tools,
        )
        action, attempts = outcome.action, len(outcome.record.attempts)
    except JudgeCallFailed as exc:
        error, attempts = str(exc)[:300], len(exc.record.attempts)
    if action is None:
        chose = ""
    elif action["kind"] == "reply":
        chose = "reply"
    elif action["name"] == "issue_refund" and action["arguments"].get("order_id") == order_id:
        chose = "refund"
    else:
        chose = f"{action['name']}({action['arguments'].get('order_id', '')})"
    return {
        "comment_id": case.comment.id,
        "comment_kind": case.comment.kind,
        "comment": case.body,
        "asks": case.asks,
        "policy": case.right,
        "wanted": wanted,
        "chose": chose,
        "right": chose == wanted,
        "error": error,
        "attempts": attempts,
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="an HF folder to serve with vLLM (default: SmolLM2-135M-Instruct)")
    p.add_argument("--judge-url", default="", help="an OpenAI-compatible endpoint instead (…/v1)")
    p.add_argument("--judge-model", default="")
    p.add_argument("--judge-key", default="")
    split_arguments(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--port", type=int, default=8073)
    p.add_argument("--log", type=Path, default=ROOT / "var" / "reader-bank.jsonl")
    args = p.parse_args(argv)

    from concurrent.futures import ThreadPoolExecutor

    from served_judge import served_judge  # scripts/, this script's own folder

    from feedback.judge.client import JudgeEndpoint
    from training.environments.comment_bank import bank_cases
    from training.promotion.evaluation.split_looks import SecondLook

    if args.judge_url:
        judge = contextlib.nullcontext(
            JudgeEndpoint(
                base_url=args.judge_url, model=args.judge_model, api_key=args.judge_key, correction_mode="actions"
            )
        )
        reader = args.judge_model or args.judge_url
    else:
        model = args.model
        if model is None:
            from training.modelprep import smollm2_prepare

            model = smollm2_prepare(ROOT / "var" / "models" / "smollm2-135m-instruct")
        judge = served_judge(
            model,
            served_name="reader",
            port=args.port,
            max_model_len=4096,
            log_path=ROOT / "var" / "reader-bank-server.log",
            start_timeout=900,
            timeout_s=600,
            deadline_s=1800,
            max_tokens=400,
            correction_mode="actions",
        )
        reader = model.name
    look = {
        "split": args.split,
        "seed": args.seed,
        # A remote reader is named by --judge-model (its URL without one).
        "family": f"reader-bank ({reader})",
        "script": "scripts/reader_bank.py",
        "argv": list(sys.argv[1:] if argv is None else argv),
        "second_look": args.second_look,
        "looks_log": args.looks_log,
    }
    try:
        bank_contexts(**look, take=False)  # refused before the reader starts
        with judge as endpoint:
            contexts = bank_contexts(**look)
            cases = bank_cases(contexts=contexts, seed=args.seed)
            started = time.monotonic()
            with ThreadPoolExecutor(args.concurrency) as pool:
                rows = list(pool.map(lambda case: read_one(case, endpoint=endpoint), cases))
    except SecondLook as exc:
        print(f"not read: {exc}", file=sys.stderr)
        return 2
    args.log.parent.mkdir(parents=True, exist_ok=True)
    with args.log.open("a") as f:
        for row in rows:
            f.write(json.dumps({"reader": reader, "split": args.split, "seed": args.seed} | row) + "\n")
    for row in rows:
        print(
            f"{row['comment_id']} {row['comment_kind']:8} wanted={row['wanted']:6} chose={row['chose'] or '-':22} "
            f"right={row['right']!s:5} | {row['comment']} {row['error']}"
        )
    print(f"{reader}: {len(rows)} comments of the bank read in {time.monotonic() - started:.0f} s")
    for label, keep in (
        ("all", lambda r: True),
        ("specific (asks the policy's action)", lambda r: r["comment_kind"] == "specific"),
        ("wrong (asks the opposite)", lambda r: r["comment_kind"] == "wrong"),
        ("vague (policy's action)", lambda r: r["comment_kind"] == "vague"),
    ):
        chosen = [r for r in rows if keep(r)]
        print(f"{label:38} {sum(r['right'] for r in chosen)}/{len(chosen)} actions right")
    failed = [r for r in rows if r["error"]]
    print(f"{'judge call failed':38} {len(failed)}/{len(rows)}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
