"""Does a reader write the refund rule from operators' words? The policy-note probe.

The reader is a judge asked for a policy note through the product's own path
(`feedback.judge.policy_notes.propose_note`: the policy-note prompt, the note's schema as
`response_format`, the parser and its re-ask). It reads comments of the comment bank
(`training/environments/data/comment_bank.json`, written apart from the simulated lead, for
evaluating readers only), each on a decision context of the TRAINING split that fits it,
with the lookup's row as the item's facts and, as the turn, the opposite of what the
comment asks (what an operator would have commented on).

Arms (every arm, every seed: one note):
- `paired`: each comment on its own case;
- `shuffled`: the control — the same rendered comments, each moved to another case (a
  derangement), so the words no longer go with the facts beside them;
- `unstated-paired` / `unstated-shuffled`: only the comments whose words do not state the
  rule (no "30", "month", "window", "period", "rule", "policy"): the line has to come from
  the facts and the verdicts together.

Each note's rule is scored against the hidden policy at the decision curve's points (a
delivered order 0-60 days after delivery, and shipped, processing and refunded orders), on
VALIDATION-split requests: the share of points where it asks for what the policy does, and
the points it does not cover. Oracle answers score the notes; the reader never sees them.

    make local-judge
    .venv/bin/python scripts/note_probe.py [--seeds 0 1 2] [--model var/judges/qwen2.5-coder-1.5b-instruct]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ARMS = ("paired", "shuffled", "unstated-paired", "unstated-shuffled")
STATES_RULE = re.compile(r"\b30\b|month|window|period|rule|policy", re.IGNORECASE)


def logged_turn(order_id: str, asks: str) -> str:
    """The turn an operator commented on: the opposite of what the comment asks."""
    if asks == "refund":
        return "I am sorry, this order cannot be refunded."
    return json.dumps({"name": "issue_refund", "arguments": {"order_id": order_id}})


def derangement(n: int, rng: random.Random) -> list[int]:
    while True:
        order = rng.sample(range(n), n)
        if n < 2 or all(i != j for i, j in enumerate(order)):
            return order


def items_for(cases, arm: str, rng: random.Random):
    from feedback.judge.policy_notes import CommentItem

    if arm.startswith("unstated"):
        cases = [c for c in cases if not STATES_RULE.search(c.body)]
    facts = [c.context.messages[-1]["content"] for c in cases]
    asks = [c.asks or c.right for c in cases]
    order_ids = [json.loads(f)["order_id"] for f in facts]
    bodies = [c.body for c in cases]
    if arm.endswith("shuffled"):
        moved = derangement(len(cases), rng)
        # The comment (and the turn it was about) goes to another case's facts.
        bodies = [bodies[j] for j in moved]
        asks = [asks[j] for j in moved]
        order_ids = [order_ids[j] for j in moved]
    return [
        CommentItem(facts=f, turn=logged_turn(i, a), comment=b)
        for f, i, a, b in zip(facts, order_ids, asks, bodies, strict=True)
    ]


def score(rule, points) -> dict:
    from training.environments.support_desk import policy_note_label

    if rule is None:
        return {"agree": 0, "covered": 0, "points": len(points), "wrong_at": []}
    agree, covered, wrong = 0, 0, []
    for p in points:
        label = policy_note_label(rule, p)
        if label is None:
            continue
        covered += 1
        if label == p.acts:
            agree += 1
        else:
            wrong.append(f"{p.status}:{p.x}" if p.x is not None else p.status)
    return {"agree": agree, "covered": covered, "points": len(points), "wrong_at": wrong}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=ROOT / "var" / "judges" / "qwen2.5-coder-1.5b-instruct")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--port", type=int, default=8074)
    p.add_argument("--max-tokens", type=int, default=600)
    p.add_argument("--log", type=Path, default=ROOT / "var" / "note-probe.jsonl")
    args = p.parse_args(argv)

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    django.setup()
    from served_judge import served_judge  # scripts/, this script's own folder

    from feedback.judge.client import JudgeCallFailed
    from feedback.judge.policy_notes import propose_note
    from feedback.judge.prompts import CURRENT_POLICY_NOTE
    from training.environments.comment_bank import bank_cases
    from training.environments.support_desk import SupportDesk

    if not (args.model / "config.json").exists():
        raise SystemExit(f"no model folder at {args.model}: run `make local-judge` first")
    desk = SupportDesk()
    train = desk.decision_contexts(tasks=desk.tasks_for(split="train", graded=True), per_point=1)
    points = desk.decision_contexts(tasks=desk.tasks_for(split="validation", graded=True), per_point=1)
    rows = []
    with served_judge(
        args.model,
        served_name="reader",
        port=args.port,
        max_model_len=8192,
        log_path=ROOT / "var" / "note-probe-server.log",
        start_timeout=1200,
        timeout_s=900,
        deadline_s=2400,
        max_tokens=args.max_tokens,
    ) as endpoint:
        try:
            for seed in args.seeds:
                cases = bank_cases(contexts=train, seed=seed)
                for arm in args.arms:
                    items = items_for(cases, arm, random.Random(f"{arm}-{seed}"))
                    started = time.monotonic()
                    rule, text, error = None, "", ""
                    try:
                        answer = propose_note(items=items, endpoint=endpoint)
                        rule, text = answer.value.rule, answer.value.text
                    except JudgeCallFailed as exc:
                        error = str(exc)[:300]
                    row = {
                        "reader": args.model.name,
                        "prompt": CURRENT_POLICY_NOTE.version,
                        "seed": seed,
                        "arm": arm,
                        "comments": len(items),
                        "text": text,
                        "rule": rule.as_dict() if rule else None,
                        "rule_text": rule.text() if rule else "",
                        "error": error,
                        "seconds": round(time.monotonic() - started, 1),
                        **score(rule, points),
                    }
                    rows.append(row)
                    print(
                        f"seed {seed} {arm:18} {row['comments']:2} comments  agree {row['agree']}/{row['points']} "
                        f"(covered {row['covered']})  {row['rule_text'] or '(no rule)'}  {error}",
                        flush=True,
                    )
        finally:
            args.log.parent.mkdir(parents=True, exist_ok=True)
            with args.log.open("a") as f:
                for row in rows:
                    f.write(json.dumps(row) + "\n")
    print("\n| arm | seeds | rule agrees with the policy at every point | mean agreement |")
    print("|---|---|---|---|")
    for arm in args.arms:
        mine = [r for r in rows if r["arm"] == arm]
        if not mine:
            continue
        exact = sum(r["agree"] == r["points"] for r in mine)
        mean = sum(r["agree"] / r["points"] for r in mine) / len(mine)
        print(f"| {arm} | {len(mine)} | {exact}/{len(mine)} | {mean:.2f} |")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
