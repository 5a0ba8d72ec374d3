"""A run's settings (`Options`), the arms it trains and the names its record uses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from desk.harness import MODEL

ROOT = Path(__file__).resolve().parent.parent.parent
OUT = ROOT / "var" / "learn-from-comments"
ARMS = ("distill", "hinted-grpo", "judge-sft", "oracle-sft", "words", "words-shuffled")
# Issue 39's A2 (the judge's chosen actions and a policy note, from the comments alone) and
# A3 (the same pipeline on the same turns, each comment moved to another turn).
WORDS_ARMS = ("words", "words-shuffled")
# The arms that call the judge: a run starts it (or reaches --judge-url) when one is asked for.
JUDGE_ARMS = ("judge-sft", *WORDS_ARMS)
NO_JUDGE = "no judge: `make local-judge` and --judge var/judges/…, or --judge-url"
JUDGE_DIR = ROOT / "var" / "judges" / "qwen2.5-coder-1.5b-instruct"  # `make local-judge`
EXPERIMENTER = "learn-from-comments"  # the account that answers for the judge gate's override
HINT_FIGURES = (
    "zero_variance_groups",
    "hinted_groups",
    "hinted_groups_with_variance",
    "hint_reward_mean",
    "hint_weight_mean",
    "hint_truncated_share",
)
ORACLE_RECIPE = "decisions-weighted-32-cf3"
COMMENT_SOURCES = ("lead", "bank")
# The arms a run on the bank's words may train: the ceiling, which reads no words, and those
# whose policy learns only what a reader made of the words (its chosen actions, a note's labels).
BANK_ARMS = ("oracle-sft", *WORDS_ARMS)
GRPO_REWARDS = {
    "oracle": "ORACLE: the support desk's tool_action grade of each sampled turn against the actions "
    "the hidden refund policy accepts (turn_reference)",
    "judge": "the judge's score_candidates of each group under the operator's comment as the rubric",
}


# `--quick`: a check that the pipeline runs end to end in minutes (CI runs it on the tiny
# test model); its figures measure nothing.
QUICK: dict = {
    "train_episodes": 6,
    "test_episodes": 3,
    "validate_episodes": 2,
    "steps": 1,
    "validate_at": [1],
    "oracle_steps": 1,
    "lora_rank": 4,
    "trainable_layers": 1,
    "prompts_per_step": 2,
    "max_new_tokens": 8,
    "group_size": 2,
    "hint_samples": 2,
    "distill_samples": 1,
}


@dataclass
class Options:
    """One run's sizes and settings (the command line's, or a test's)."""

    model: Path = MODEL
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    arms: tuple[str, ...] = ARMS
    train_episodes: int = 48
    test_episodes: int = 48
    validate_episodes: int = 16
    fresh_seeds: list[int] = field(default_factory=lambda: [3])
    steps: int = 40
    validate_at: list[int] = field(default_factory=lambda: [20, 40])
    # A1's recipe (scripts/desk/recipes.py) and its steps; None: the recipe's own steps and
    # checkpoints. 75 is decisions-weighted-32-cf3's first checkpoint (150 took 50 min a seed).
    oracle_recipe: str = ORACLE_RECIPE
    oracle_steps: int | None = 75
    learning_rate: float = 5e-4
    lora_rank: int = 16
    trainable_layers: int = 6
    prompts_per_step: int = 4
    max_new_tokens: int = 48
    group_size: int = 4
    hint_samples: int = 4
    hint_cap: float = 3.0
    distill_samples: int = 2
    hint_at: str = "system"  # where the teacher / hinted samples read the comment: "system" or "last"
    grpo_reward: str = "oracle"
    judge: Path | None = None  # the judge: an HF folder (vLLM) or a .gguf file (llama-server)
    judge_url: str = ""  # or an OpenAI-compatible endpoint (…/v1)
    judge_model: str = ""
    judge_key: str = ""
    judge_concurrency: int = 8
    # Whose words the decision turns' comments are in: "lead" (the simulated lead's
    # templates) or "bank" (the comment bank's phrasings, written apart: `bank_words`).
    comments: str = "lead"
    vague_rate: float | None = None  # None: the simulated lead's own defaults
    wrong_rate: float | None = None
    out: Path = OUT
    run: str = ""
    # Where each arm's look at the test split is checked and logged (`split_looks`): the
    # command line's default is the project's log; None (a quick run's, whose figures
    # measure nothing, and `Options()`'s) logs and refuses nothing.
    looks_log: Path | None = None
    second_look: str = ""  # the reason for measuring an arm already measured on the test split
    # Measure the base again even where another process of the run logged it for the seed.
    base_again: bool = False
    argv: list[str] = field(default_factory=list)  # the command line, for the looks log
    commit: str = ""  # the commit the run started at (filled in by `run`)
