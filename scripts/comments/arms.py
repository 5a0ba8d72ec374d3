"""The arms, each trained from the base for one seed: comment-conditioned distillation,
hinted GRPO, SFT on the judge's corrections, the words-only arm and its control
(`comments.words`) and the oracle-label ceiling; each keeps the checkpoint that did best on
validation-split episodes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from desk import log
from desk.harness import TEMPERATURE, Harness
from desk.measure import eval_tasks, measure
from desk.recipes import BASE_RECIPE, RECIPES
from desk.train import train

from comments.comment_set import item_tasks, oracle_reward
from comments.judge import JudgeServer, judge_corrections
from comments.options import GRPO_REWARDS, HINT_FIGURES, NO_JUDGE, ORACLE_RECIPE, WORDS_ARMS, Options


class _Keeper:
    """Checkpoint choice on validation-split episodes under the harness: at each of the
    `validate_at` steps, the success rate on the same validation tasks; the best adapter
    weights are kept and restored at the end (ties keep the earlier step)."""

    def __init__(self, policy, *, seed: int, options: Options, label: str):
        self.policy = policy
        self.seed = seed
        self.at = set(options.validate_at)
        self.label = label
        self.harness = Harness(policy.model, policy.tokenizer)
        self.tasks = eval_tasks(split="validation", episodes=options.validate_episodes, seed=seed)
        self.best: dict[str, Any] = {"step": 0, "success": -1.0, "state": None}
        self.history: list[dict[str, Any]] = []

    def on_step(self, step: int, metrics: dict) -> None:
        if step % 10 == 0:
            log(f"  {self.label} step {step}: loss {metrics.get('loss', 0):.3f}")
        if step not in self.at:
            return
        result = measure(self.harness, self.tasks, seed=self.seed, label=f"{self.label} validation at {step}")
        self.policy.model.train()
        self.history.append({"step": step, "success": result["success_rate"], "n": result["n"]})
        if result["success_rate"] > self.best["success"]:
            state = {k: v.detach().clone() for k, v in self.policy.model.named_parameters() if v.requires_grad}
            self.best.update(step=step, success=result["success_rate"], state=state)

    def restore(self) -> int:
        import torch

        if self.best["state"] is None:
            return 0
        params = dict(self.policy.model.named_parameters())
        with torch.no_grad():
            for name, value in self.best["state"].items():
                params[name].copy_(value)
        return self.best["step"]


def _common(options: Options, seed: int) -> dict[str, Any]:
    import torch

    return {
        "model_path": str(options.model),
        "adapter": "lora",
        "lora_rank": options.lora_rank,
        "lora_alpha": 2 * options.lora_rank,
        "trainable_layers": options.trainable_layers,
        "learning_rate": options.learning_rate,
        "steps": options.steps,
        "prompts_per_step": options.prompts_per_step,
        "max_new_tokens": options.max_new_tokens,
        "temperature": TEMPERATURE,
        "seed": seed,
        "eval_every": 0,
        "checkpoint_every": 0,
        "samples_every": 0,
        "torch_threads": torch.get_num_threads(),
    }


def grpo_config(options: Options, seed: int):
    """The hinted-GRPO config, or the ConfigError of a GRPO config without the hint fields."""
    from training.trainer.config import DistillConfig, GRPOConfig

    return GRPOConfig.from_dict(
        _common(options, seed)
        | {
            "group_size": options.group_size,
            "log_kl": False,  # no reference pass: the CPU's time goes to samples
            "hint_samples": options.hint_samples,
            "hint_template": DistillConfig.hint_template,
            "hint_cap": options.hint_cap,
            "hint_at": options.hint_at,
        }
    )


def judge_sft_train(*, comments: dict[str, Any], seed: int, options: Options, run_dir: Path, judge: JudgeServer):
    """SFT on the judge's corrections, with the oracle recipe's settings (not tuned here)."""
    from training.services.job_runner import training_set_items

    if not judge.configured:
        return None, NO_JUDGE
    if judge.failed:
        return None, f"the judge did not start: {judge.failed}"
    training_set, figures, ours = judge_corrections(comments=comments, seed=seed, options=options, judge=judge)
    judged_here = {row.key for row in training_set.items.all() if row.provenance.get("judge_result") in ours}
    items, _ = training_set_items(training_set)
    items = [it for it in items if it.target and it.id in judged_here]
    if not items:
        return None, f"the judge wrote no correction ({figures})"
    policy, trained = sft_arm(
        items, recipe=ORACLE_RECIPE, seed=seed, options=options, run_dir=run_dir, label="judge-sft"
    )
    return policy, {
        "signal": "the simulated lead's comments (words only), turned into corrected responses by the judge",
        "judge": figures,
        "training_set": str(training_set),
        **trained,
    }


def sft_arm(items: list, *, recipe: str, seed: int, options: Options, run_dir: Path, label: str):
    """SFT from the base on `items` for `options.steps` steps with the learning rate and
    first-token weight of desk recipe `recipe`, the checkpoint chosen on validation:
    (policy, its training record)."""
    import torch

    from training.trainer.common import Hooks
    from training.trainer.config import SFTConfig
    from training.trainer.distill import sft_train
    from training.trainer.policy import load_policy

    settings = RECIPES[recipe]
    config = SFTConfig.from_dict(
        _common(options, seed)
        | {"learning_rate": settings["learning_rate"], "first_token_weight": settings["first_token_weight"]}
    )
    torch.manual_seed(seed)
    policy = load_policy(config)
    keeper = _Keeper(policy, seed=seed, options=options, label=f"{label} seed {seed}")
    started = time.time()
    result = sft_train(
        config=config, items=items, run_dir=run_dir, policy=policy, export=False, hooks=Hooks(on_step=keeper.on_step)
    )
    return policy, _trained(config, items, result, keeper, started)


def _trained(config, items: list, result, keeper: _Keeper, started: float) -> dict[str, Any]:
    """An arm's training record, once the best validation checkpoint is restored."""
    kept = keeper.restore()
    return {
        "settings": config.to_dict(),
        "train_items": len(items),
        "steps_run": result.step,
        "step_kept": kept,
        "status": result.status,
        "validation": keeper.history,
        "final_loss": result.history[-1].get("loss") if result.history else None,
        "train_seconds": round(time.time() - started, 1),
    }


def oracle_settings(options: Options) -> dict[str, Any]:
    """A1's settings: its desk recipe, with the run's validation episodes, `--oracle-steps`
    where given (checkpoints at half and end) and the run's adapter where it names one other
    than the default (--quick's, for the tiny model)."""
    recipe = {**BASE_RECIPE, **RECIPES[options.oracle_recipe]}
    if options.oracle_steps is not None:
        steps = options.oracle_steps
        recipe |= {"steps": steps, "validate_at": sorted({max(1, steps // 2), steps})}
    recipe["validate_episodes"] = options.validate_episodes
    if (options.lora_rank, options.trainable_layers) != (Options.lora_rank, Options.trainable_layers):
        recipe |= {
            "lora_rank": options.lora_rank,
            "lora_alpha": 2 * options.lora_rank,
            "trainable_layers": options.trainable_layers,
        }
    return recipe


def arm_train(
    arm: str, *, comments: dict[str, Any], seed: int, options: Options, run_dir: Path, judge: JudgeServer | None = None
):
    """Train `arm` from the base for one seed: (policy, record of its training), or
    (None, reason) when the arm cannot run here."""
    import torch

    from training.services.job_runner import scorer_for, training_set_items
    from training.trainer.common import Hooks
    from training.trainer.config import ConfigError, DistillConfig
    from training.trainer.distill import distill_train
    from training.trainer.grpo import grpo_train
    from training.trainer.policy import load_policy

    if arm == "oracle-sft":
        recipe = oracle_settings(options)
        policy, info = train(recipe, seed=seed, run_dir=run_dir, model=options.model)
        return policy, info | {
            "recipe": options.oracle_recipe,
            "settings": recipe,
            "signal": "oracle labels (computed from the hidden policy)",
        }

    if arm == "judge-sft":
        return judge_sft_train(
            comments=comments, seed=seed, options=options, run_dir=run_dir, judge=judge or JudgeServer(options)
        )
    if arm in WORDS_ARMS:
        from comments.words import words_train  # it trains with `sft_arm` from here

        return words_train(
            arm, comments=comments, seed=seed, options=options, run_dir=run_dir, judge=judge or JudgeServer(options)
        )
    items, _ = training_set_items(comments["training_set"])
    if arm == "hinted-grpo":
        try:
            config = grpo_config(options, seed)
        except ConfigError as exc:
            return None, f"the GRPO config refuses the hint fields ({exc}): hinted GRPO is not in this build"
        if options.grpo_reward == "oracle":
            score = oracle_reward(item_tasks(comments["training_set"]))
        else:
            score = scorer_for(items, deployment=comments["deployment"])
    else:
        config = DistillConfig.from_dict(
            _common(options, seed) | {"samples_per_prompt": options.distill_samples, "hint_at": options.hint_at}
        )
    torch.manual_seed(seed)
    policy = load_policy(config)
    keeper = _Keeper(policy, seed=seed, options=options, label=f"{arm} seed {seed}")
    started = time.time()
    common = {"config": config, "items": items, "run_dir": run_dir, "policy": policy, "export": False}
    hooks = Hooks(on_step=keeper.on_step)
    if arm == "hinted-grpo":
        result = grpo_train(score=score, hooks=hooks, **common)
    else:
        result = distill_train(hooks=hooks, **common)
    info = {"signal": "the simulated lead's comments (words only)", **_trained(config, items, result, keeper, started)}
    if arm == "hinted-grpo":
        info["reward"] = f"{options.grpo_reward}: {GRPO_REWARDS[options.grpo_reward]}"
        info["reward_mean"] = [h.get("reward_mean") for h in result.history]
        # Per step: whether the comments gave any gradient at all (a hinted group that
        # gained variance), and how far the hinted samples were reweighed.
        info["hint_steps"] = [
            {k: h.get(k) for k in HINT_FIGURES if k in h} | {"step": h.get("step")} for h in result.history
        ]
    return policy, info
