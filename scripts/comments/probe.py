"""Does the comment make the policy's own turn right? The teacher measured before any
training, by the oracle grade."""

from __future__ import annotations

import time
from typing import Any

from desk import log
from desk.harness import MAX_TURN_TOKENS, Harness, load_base

from comments.comment_set import comments_set, item_tasks
from comments.options import Options
from comments.runs import append, comments_log


def hint_probe(options: Options, samples: int = 8) -> None:
    """For each commented turn of each seed's comments set: how often the base's own sampled
    turn (under the harness's regex) is right with no hint, with the comment in the system
    message and with the comment as the last message. "Right" is the ORACLE `tool_action`
    grade: it only measures the teacher that comment-conditioned distillation and hinted GRPO
    would learn from, it trains nothing. Split by the kind of turn the reference is (the
    first call on an order, a refund, a reply) since the comments differ by kind."""
    import torch

    from training.environments.support_desk import turn_reference
    from training.services.job_runner import training_set_items
    from training.trainer.config import DistillConfig
    from training.trainer.graders import grade
    from training.trainer.items import with_hint
    from training.trainer.sampling import encode_prompt

    options.run = options.run or time.strftime("probe-%Y%m%d-%H%M%S")
    base_model, tokenizer = load_base(options.model)
    harness = Harness(base_model, tokenizer)
    template = DistillConfig.hint_template  # the hint both arms train with
    totals: dict[tuple[str, str], list[float]] = {}
    for seed in options.seeds:
        comments = comments_set(harness=harness, seed=seed, options=options)
        comments_log(options, seed, comments)
        task_of = item_tasks(comments["training_set"])
        items, _ = training_set_items(comments["training_set"])
        for n, item in enumerate(items):
            reference = turn_reference(task=task_of[item.id], messages=item.messages) or ""
            first = not any(m.get("role") == "assistant" for m in item.messages)
            kind = "first call" if first else ("refund" if "refund" in reference else "reply or lookup")
            variants = {
                "none": item.messages,
                "system": with_hint(item.messages, template.format(feedback=item.feedback), at="system"),
                "last": with_hint(item.messages, template.format(feedback=item.feedback), at="last"),
            }
            row: dict[str, Any] = {"kind": "probe", "seed": seed, "turn": kind, "comment": item.feedback[:300]}
            for name, messages in variants.items():
                ids = encode_prompt(tokenizer, messages, item.tools)
                pattern = harness.first if first else harness.later
                rows = [
                    (ids, pattern, torch.Generator().manual_seed(seed * 7919 + n * 101 + k), MAX_TURN_TOKENS)
                    for k in range(samples)
                ]
                texts = [text for text, _, _ in harness.decode(rows)]
                right = [grade("tool_action", t, reference) for t in texts]
                row[name] = sum(right) / len(right)
                totals.setdefault((kind, name), []).append(row[name])
            log(f"seed {seed} item {n} ({kind}): " + ", ".join(f"{k} {row[k]:.2f}" for k in variants))
            append(options, row)
    print("\nShare of the base's own sampled turns graded right (ORACLE grade, measurement only):\n")
    print(f"  {'turn':<16} {'n':>3}  {'no hint':>8} {'system':>8} {'last':>8}")
    for kind in sorted({k for k, _ in totals}):
        cells = [totals[(kind, v)] for v in ("none", "system", "last")]
        mean = [sum(c) / len(c) for c in cells]
        print(f"  {kind:<16} {len(cells[0]):>3}  {mean[0]:>8.2f} {mean[1]:>8.2f} {mean[2]:>8.2f}")
