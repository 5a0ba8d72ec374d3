"""The decision read off a model: P(refund) after a lookup per kind of order, with and
without the lead's comment as a hint, and the decision curve by days since delivery."""

from __future__ import annotations

import json
from typing import Any

from desk import OUT
from desk.harness import TOP_K, Harness, load_base
from desk.items import oracle_items


def command_decisions(args) -> None:
    """P(the turn after a lookup starts a tool call) — i.e. refunds — per kind of order,
    on the first `--turns` decision contexts of the train split and of `--split` (validation
    unless asked: an adapter's figures on the test split are part of its recipe's look): a
    model that learned the policy puts it near 1 for delivered orders at most 30 days old and
    near 0 for the rest, on both splits; one that learned "refund after a lookup" puts it
    high everywhere."""
    import torch

    from training.environments.support_desk import REFUND_WINDOW_DAYS, SupportDesk
    from training.trainer.sampling import encode_prompt

    model, tokenizer = load_base()
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter)
    model.eval()
    start = tokenizer.convert_tokens_to_ids("<")  # "<tool_call>" is tokenised "<", "tool", …
    desk = SupportDesk()
    tasks = {t.id: t for t in desk.tasks()}

    def p_refund(messages, tools) -> float:
        ids = torch.tensor([encode_prompt(tokenizer, messages, tools)])
        with torch.no_grad():
            return float(torch.softmax(model(input_ids=ids, logits_to_keep=1).logits[0, -1].float(), -1)[start])

    for split in ("train", args.split):
        items = oracle_items(desk.tasks_for(split=split, graded=True), prefix=split)
        kinds: dict[str, list[float]] = {}
        for item in [i for i in items if len(i.messages) == 4][: args.turns]:
            p = p_refund(item.messages, item.tools)
            if args.hint:
                # The self-distillation teacher's view: the simulated lead's comment on the
                # wrong turn here (a refusal of a refundable order, a refund of another) as
                # the system hint; the figure printed is P(refund) with it minus without.
                p = p_refund(hinted(tasks[item.id.split(":")[1]], item.messages, at=args.hint_at), item.tools) - p
            row = json.loads(item.messages[-1]["content"])
            days = row["delivered_days_ago"]
            kind = (
                row["status"]
                if row["status"] != "delivered"
                else f"delivered, {'≤' if days <= REFUND_WINDOW_DAYS else '>'} 30 days"
            )
            kinds.setdefault(kind, []).append(p)
        print(f"{split}: " + "; ".join(f"{k} {sum(v) / len(v):.2f} (n={len(v)})" for k, v in sorted(kinds.items())))


def command_curve(args) -> None:
    """The decision curve on `--split`'s held-out decision contexts (`decision_contexts`):
    P(the turn after a lookup is a refund call) by days since delivery, and per other status,
    read off the model as the probability of the call's opening tokens
    (`<tool_call>{"name": "issue_refund`) under the harness's constraint and temperature
    (`p_refund`: unconstrained, the call's opening is all but impossible for every model,
    which the harness's regex then forces), for the base and a run's kept adapter. A model
    that learned the rule draws a step down after day 30 and nowhere before; the mean of
    each side of the line is printed."""
    import torch

    from training.environments.support_desk import SupportDesk
    from training.promotion.evaluation.decision_curve import rule_step
    from training.trainer.sampling import encode_prompt

    model, tokenizer = load_base()
    adapter = args.adapter
    if args.recipe:
        runs = [json.loads(line) for line in (OUT / "runs.jsonl").read_text().splitlines() if line.strip()]
        run = next(r for r in reversed(runs) if r.get("recipe") == args.recipe and r["seed"] == args.seed)
        adapter = run["train"]["adapter"]
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    desk = SupportDesk()
    curve = desk.decision_curve()
    # Without the closing quote, which the call's text merges with the comma after it.
    opening = tokenizer.encode('<tool_call>{"name": "issue_refund', add_special_tokens=False)
    contexts = desk.decision_contexts(
        tasks=desk.tasks_for(split=args.split, graded=True), per_point=args.per_point, every=args.every
    )

    harness = Harness(model, tokenizer)

    def p_refund(context) -> float:
        """The probability that the harness's sampling writes the opening along its own
        tokens: at each of them, the token's share among the `TOP_K` likeliest that keep the
        turn a prefix of `ACT_OR_REPLY_REGEX`, at the harness's temperature (as `_pick`
        draws). Other tokenizations of the same text are not counted: a lower bound."""
        prompt = encode_prompt(tokenizer, context.messages, context.tools)
        ids = torch.tensor([prompt + opening])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
        p, text = 1.0, ""
        for row, token in zip(logits, opening, strict=True):
            order = torch.topk(row, TOP_K).indices.tolist()
            allowed = [t for t in order if harness._ok(t, text, harness.later, False)]
            if token not in allowed:
                return 0.0
            p *= float(torch.softmax(row[allowed] / harness.temperature, dim=0)[allowed.index(token)])
            text += harness.vocab[token]
        return p

    points: dict[Any, list[float]] = {}
    for context in contexts:
        key = context.x if context.status == curve.status else context.status
        points.setdefault(key, []).append(p_refund(context))
    series = [[x, sum(v) / len(v), len(v)] for x, v in points.items() if isinstance(x, int)]
    within, past = rule_step(series, curve.threshold)
    print(f"{adapter or 'base'} on {args.split} ({len(contexts)} contexts):")
    print("  " + " ".join(f"{x}:{p:.2f}" for x, p, _n in series))
    print("  " + "; ".join(f"{k} {sum(v) / len(v):.2f}" for k, v in points.items() if not isinstance(k, int)))
    print(f"  mean P(refund) at most {curve.threshold} days {within:.3f}, past it {past:.3f}")


def hinted(task, messages: list[dict[str, Any]], *, at: str = "system") -> list[dict[str, Any]]:
    """`messages` with the simulated lead's specific comment on the wrong next turn as the
    distillation teacher's hint (`DistillConfig.hint_template`): in the system message, as
    the distill job puts it, or (`at="last"`) as a user message right before the decision."""
    import random

    from training.environments.support_operator import operator_comment
    from training.trainer.config import DistillConfig
    from training.trainer.items import with_hint

    order_id = task.hidden["order_id"]
    wrong = (
        {"role": "assistant", "content": "I am sorry, this order cannot be refunded."}
        if task.hidden["refund"]
        else {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_wrong",
                    "type": "function",
                    "function": {"name": "issue_refund", "arguments": json.dumps({"order_id": order_id})},
                }
            ],
        }
    )
    comment = operator_comment(
        task=task, messages=[*messages, wrong], rng=random.Random(task.id), vague_rate=0, wrong_rate=0
    )
    hint = DistillConfig.hint_template.format(feedback=comment.body)
    if at == "last":
        return [*messages, {"role": "user", "content": hint}]
    return with_hint(messages, hint)
