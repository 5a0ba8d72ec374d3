"""One recipe's training run: its set built, SFT with LoRA, and the checkpoint kept."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from desk import log
from desk.harness import MODEL, TEMPERATURE, Harness
from desk.items import base_answers, note_items, note_of, oracle_items, words_only_check
from desk.measure import eval_tasks, measure
from desk.recipes import VARIANT_CASES


def checkpoint_key(metrics: dict[str, Any], *, rule: str) -> tuple[float, ...]:
    """How a validation look ranks a checkpoint, higher kept (the earliest on ties, as the
    caller keeps a later one only when its key is higher): "success" by the success rate
    alone, "violations" by the fewest episodes with a policy violation first."""
    reward = float(metrics.get("reward", 0.0))
    if rule == "violations":
        if "violations" not in metrics:  # a look that did not count them is not a clean one
            raise ValueError("checkpoint_rule 'violations' needs the look's violations")
        return (-float(metrics["violations"]), reward)
    if rule == "success":
        return (reward,)
    raise ValueError(f"unknown checkpoint_rule {rule!r}")


def checkpoint_improves(
    metrics: dict[str, Any], kept: tuple[float, ...] | None, *, rule: str
) -> tuple[float, ...] | None:
    """The look's key when it replaces the kept checkpoint (`kept`: that one's key, None
    before the first look), else None: only a strictly higher key does, so ties keep the
    earlier step."""
    key = checkpoint_key(metrics, rule=rule)
    return key if kept is None or key > kept else None


def train(recipe: dict[str, Any], *, seed: int, run_dir: Path, model: Path = MODEL):
    """SFT (LoRA on the top blocks) with `sft_train`; with `early_stop`, the validation
    split's turns are graded every `eval_every` steps and the best adapter is kept."""
    import torch

    from training.environments.support_desk import SupportDesk
    from training.trainer.common import Hooks
    from training.trainer.config import SFTConfig
    from training.trainer.distill import sft_train
    from training.trainer.items import TurnItem, grader_scorer
    from training.trainer.policy import load_policy

    desk = SupportDesk()
    train_tasks = desk.tasks_for(split="train", graded=True)
    if recipe["orders"]:
        refundable = [t for t in train_tasks if t.hidden["refund"]][: recipe["orders"] // 2]
        refused = [t for t in train_tasks if not t.hidden["refund"]][: recipe["orders"] - len(refundable)]
        train_tasks = refundable + refused
    if recipe["labels"] == "note":
        rule, text = note_of(recipe["note_arm"], seed, prompt=recipe["note_prompt"])
        log(f"labels from the {recipe['note_arm']} note of seed {seed}: {rule.text()}")
        items = note_items(
            train_tasks, rule=rule, text=text, variants=recipe["variants"], rng=random.Random(f"variants-{seed}")
        )
        words_only_check(items, rule=rule, text=text)
    else:
        items = oracle_items(
            train_tasks,
            prefix="train",
            variants=recipe["variants"],
            near_line=recipe["near_line_variants"],
            rng=random.Random(f"variants-{seed}"),
            cases=VARIANT_CASES[recipe["variant_cases"]],
        )
    if recipe["focus"] == "decisions":
        # context length → keep one in N (first turn, decision, confirmation)
        keep_every = {2: recipe["keep_first"], 4: 1, 6: recipe["keep_confirm"]}
        seen: dict[int, int] = {}
        kept = []
        for item in items:
            length = len(item.messages)
            seen[length] = seen.get(length, 0) + 1
            if (seen[length] - 1) % keep_every.get(length, 1) == 0:
                kept.append(item)
        items = kept
    if recipe["decision_repeats"] > 1:
        items += [
            TurnItem(**{**item.__dict__, "id": f"{item.id}:r{r}"})
            for r in range(1, recipe["decision_repeats"])
            for item in items
            if len(item.messages) == 4
        ]
    rng = random.Random(seed)
    validation = oracle_items(desk.tasks_for(split="validation", graded=True), prefix="validation")
    validation = rng.sample(validation, min(recipe["validation_turns"], len(validation)))
    config = SFTConfig(
        model_path=str(model),
        adapter="lora",
        lora_rank=recipe["lora_rank"],
        lora_alpha=recipe["lora_alpha"],
        trainable_layers=recipe["trainable_layers"],
        learning_rate=recipe["learning_rate"],
        first_token_weight=recipe["first_token_weight"],
        steps=recipe["steps"],
        prompts_per_step=recipe["prompts_per_step"],
        seed=seed,
        eval_every=recipe["eval_every"] if recipe["early_stop"] else 0,
        eval_samples=1,
        max_new_tokens=40,
        temperature=TEMPERATURE,
        checkpoint_every=0,
        samples_every=0,
        torch_threads=torch.get_num_threads(),
    )
    torch.manual_seed(seed)
    policy = load_policy(config)
    mixed = 0
    if recipe["mix_base"]:
        harness = Harness(policy.model, policy.tokenizer)
        with policy.model.disable_adapter():
            others = desk.tasks_for(split="train", graded=False)
            wanted = int(len(items) * recipe["mix_base"])
            extra = base_answers(harness, rng.sample(others, min(wanted, len(others))), seed=seed, prefix="base")
        items += extra
        mixed = len(extra)
        policy.model.train()
    best: dict[str, Any] = {"step": 0, "key": None, "state": None}
    evals: list[dict] = []
    stale = [0]

    def on_eval(step: int, metrics: dict) -> None:
        evals.append({"step": step, **{k: v for k, v in metrics.items() if isinstance(v, int | float)}})
        log(f"  validation turns at step {step}: reward {metrics.get('reward', 0):.3f}")
        key = checkpoint_improves(metrics, best["key"], rule=recipe["checkpoint_rule"])
        if key is not None:
            best.update(step=step, key=key)
            best["state"] = {k: v.detach().clone() for k, v in policy.model.named_parameters() if v.requires_grad}
            stale[0] = 0
        else:
            stale[0] += 1

    harness_val = Harness(policy.model, policy.tokenizer) if recipe["validate_at"] else None
    validation_tasks = (
        eval_tasks(split="validation", episodes=recipe["validate_episodes"], seed=seed) if harness_val else []
    )

    def on_step(step: int, metrics: dict) -> None:
        if step % 10 == 0:
            log(f"  step {step}: loss {metrics['loss']:.3f} ({metrics['step_seconds']:.1f} s)")
        if harness_val is not None and step in recipe["validate_at"]:
            result = measure(harness_val, validation_tasks, seed=seed, label=f"validation at step {step}")
            policy.model.train()
            on_eval(
                step,
                {
                    "reward": result["success_rate"],
                    "violations": result["violations"],
                    "validation_episodes": result["n"],
                },
            )

    hooks = Hooks(
        on_eval=on_eval,
        on_step=on_step,
        should_stop=lambda: recipe["early_stop"] and stale[0] >= recipe["patience"],
    )
    started = time.time()
    result = sft_train(
        config=config,
        items=items,
        run_dir=run_dir,
        eval_items=validation if recipe["early_stop"] else None,
        eval_score=grader_scorer("tool_action") if recipe["early_stop"] else None,
        hooks=hooks,
        policy=policy,
        export=False,
    )
    kept = result.step
    if (recipe["early_stop"] or recipe["validate_at"]) and best["state"] is not None:
        params = dict(policy.model.named_parameters())
        with torch.no_grad():
            for name, value in best["state"].items():
                params[name].copy_(value)
        kept = best["step"]
    info = {
        "train_orders": len(train_tasks),
        "train_items": len(items),
        "base_items_mixed": mixed,
        "steps_run": result.step,
        "step_kept": kept,
        "status": result.status,
        "validation": evals,
        "final_loss": result.history[-1]["loss"] if result.history else None,
        "train_seconds": round(time.time() - started, 1),
    }
    return policy, info
