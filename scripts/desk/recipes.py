"""The support-desk training recipes (`RECIPES`, each a change to `BASE_RECIPE`) and the
cases their counterfactual copies are drawn from."""

from __future__ import annotations

from typing import Any

from desk import ROOT

BASE_RECIPE: dict[str, Any] = {
    "orders": 0,  # training orders used (0 = every order of the train split)
    "steps": 40,
    "prompts_per_step": 4,
    "learning_rate": 5e-4,
    "lora_rank": 16,
    "lora_alpha": 32,
    "trainable_layers": 6,
    "early_stop": False,
    "eval_every": 20,
    "patience": 2,
    "validation_turns": 12,
    "mix_base": 0.0,  # share of extra items: the base model's own answers on other turns
    # "decisions": every turn that follows a lookup (refund or refuse: where the policy is),
    # one in two first turns (the lookup) and one in four confirmations after a refund.
    "focus": "",
    # Checkpoint choice on whole validation-split episodes under the harness (the measure the
    # test reports, on other orders): at these steps, the checkpoint `checkpoint_rule` ranks
    # first is kept (by default the best success rate).
    "validate_at": [],
    "validate_episodes": 16,
    "first_token_weight": 1.0,  # see training.trainer.loss.sft_loss
    # Counterfactual copies of each decision point: the lookup shows another status and
    # age, the target is what the policy does then (support_desk.counterfactual_turns).
    "variants": 0,
    # More copies, each near the line (22-40 days since delivery: NEAR_LINE_CASES).
    "near_line_variants": 0,
    # Which of `_case`'s eight cases the `variants` copies are drawn from (all by default:
    # four refundable, so a delivered order is refundable in 4 copies of 6). "balanced":
    # BALANCED_CASES, as many refusals of a delivered order as refunds; "past": PAST_CASES;
    # "even": EVEN_CASES; "old": OLD_CASES.
    "variant_cases": "all",
    # With focus "decisions": keep one in N first turns (the lookup) and one in N
    # confirmations after a refund; every decision turn (after the lookup) is kept.
    "keep_first": 2,
    "keep_confirm": 4,
    # Each decision turn (and its copies) this many times in the set: its weight in a step's
    # sampling, against the lookups and confirmations.
    "decision_repeats": 1,
    # How `validate_at` picks the checkpoint kept: "success", the best success rate (the
    # earliest on ties); "violations", the fewest episodes with a policy violation, then the
    # best success rate (the earliest on ties): the co-primary endpoint first.
    "checkpoint_rule": "success",
    # "oracle": the hidden policy's turns and copies; "note": the decision points of the
    # training orders and `variants` copies of each, labelled by a policy note a reader wrote
    # from the comment bank (`note_items`: words only, no oracle label), the note of the
    # run's seed in `note_arm` of NOTES.
    "labels": "oracle",
    "note_arm": "",
    "note_prompt": "",
}
# The dealt split's recipes share these (`cf3-ckpt`); each later one names its one change.
_CF3: dict[str, Any] = {
    "focus": "decisions",
    "steps": 150,
    "learning_rate": 1e-3,
    "first_token_weight": 32.0,
    "validate_at": [50, 100, 150],
    "variants": 3,
}
RECIPES: dict[str, dict[str, Any]] = {
    "memorise": {"orders": 8, "steps": 200},
    "templates": {},
    "templates-es": {"early_stop": True},
    "templates-es-r4": {"early_stop": True, "lora_rank": 4, "lora_alpha": 8, "steps": 40},
    "templates-es-mix": {"early_stop": True, "mix_base": 0.25},
    "decisions-es": {"early_stop": True, "focus": "decisions"},
    "decisions-es-lr1e-3": {"early_stop": True, "focus": "decisions", "learning_rate": 1e-3},
    "decisions-long": {"focus": "decisions", "steps": 200, "validate_at": [100, 150, 200]},
    "decisions-long-lr1e-3": {
        "focus": "decisions",
        "steps": 200,
        "learning_rate": 1e-3,
        "validate_at": [100, 150, 200],
    },
    # The decision token weighted (16 of a ~30-token target: about a third of a turn's loss).
    "decisions-weighted": {
        "focus": "decisions",
        "steps": 150,
        "learning_rate": 1e-3,
        "first_token_weight": 16.0,
        "validate_at": [50, 100, 150],
    },
    # Half of a turn's loss on its decision token.
    "decisions-weighted-32": {
        "focus": "decisions",
        "steps": 150,
        "learning_rate": 1e-3,
        "first_token_weight": 32.0,
        "validate_at": [75, 150],
    },
    # The same, with 3 counterfactual copies of every decision point.
    "decisions-weighted-32-cf3": {
        "focus": "decisions",
        "steps": 150,
        "learning_rate": 1e-3,
        "first_token_weight": 32.0,
        "validate_at": [75, 150],
        "variants": 3,
    },
    # 2026-12-06 (the dealt split): the checkpoint chosen on 16 validation episodes at 50, 100
    # or 150 steps; then, one at a time: 3 more copies near the line, decision turns twice
    # in the set, fewer lookup targets.
    "cf3-ckpt": _CF3,
    "cf3-near3": {**_CF3, "near_line_variants": 3},
    "cf3-near3-dec2": {**_CF3, "near_line_variants": 3, "decision_repeats": 2},
    "cf3-near3-lookup4": {**_CF3, "near_line_variants": 3, "keep_first": 4},
    # 2026-12-06, second family (aimed at the refusals past the line): the copies drawn so
    # that a delivered order is refused as often as refunded (BALANCED_CASES); then 3 more
    # copies near the line, as in cf3-near3.
    "bal6": {**_CF3, "variants": 6, "variant_cases": "balanced"},
}
RECIPES["bal6-near3"] = {**RECIPES["bal6"], "near_line_variants": 3}
# 2026-12-06, third family (aimed at the 40s and 50s): bal6's copies drawn over
# PAST_CASES, where a delivered copy is refundable or late as often, and the late ones are
# 31-40, 41-60 and past 60 days old equally often; then the same with 10 copies.
RECIPES["past6"] = {**RECIPES["bal6"], "variant_cases": "past"}
RECIPES["past10"] = {**RECIPES["past6"], "variants": 10}
# 2026-12-07, fourth family (every age shown as often as any other): the copies' refundable ages
# spread evenly over 0-30 and the late ones over 31-60 (EVEN_CASES); then 10 copies.
RECIPES["even6"] = {**RECIPES["bal6"], "variant_cases": "even"}
RECIPES["even10"] = {**RECIPES["even6"], "variants": 10}
# 2026-12-07, fifth family (what the model is trained with, not which copies it sees): bal6
# with adapters on all 30 blocks of SmolLM2-135M; bal6 for 300 steps.
RECIPES["bal6-all30"] = {**RECIPES["bal6"], "trainable_layers": 30}
RECIPES["bal6-s300"] = {**RECIPES["bal6"], "steps": 300, "validate_at": [100, 200, 300]}
# 2026-12-07, sixth family (three-digit ages read as the teens they begin like; seeds that
# differ): bal6-s300's copies plus one more refundable recent and one delivered 100-180
# days ago (OLD_CASES), and the checkpoint with the fewest validation violations kept.
RECIPES["old8-s300"] = {
    **RECIPES["bal6-s300"],
    "variants": 8,
    "variant_cases": "old",
    "checkpoint_rule": "violations",
}
# Issue 39's words-only arm (A2) and its control (A3), bal6's settings with labels from a
# policy note: the note the reader wrote from the comments on their own cases, or from the
# comments each moved to another case (`scripts/note_probe.py`).
# `-v2`: the notes written under the policy-note prompt v2 (the rule carries every fact its
# text names, and an otherwise).
for _arm, _note, _prompt in (
    ("words-note", "paired", "policy-note/v1"),
    ("words-note-shuffled", "shuffled", "policy-note/v1"),
    ("words-note-v2", "paired", "policy-note/v2"),
    ("words-note-v2-shuffled", "shuffled", "policy-note/v2"),
):
    RECIPES[_arm] = {
        **{k: v for k, v in RECIPES["bal6"].items() if k != "variant_cases"},
        "labels": "note",
        "note_arm": _note,
        "note_prompt": _prompt,
    }
NOTES = ROOT / "docs" / "experiments" / "2026-12-06-notes-from-words.jsonl"
# `_case`'s cases: one refundable recent, one refundable near the line, one late near the
# line, one long past, one shipping, one processing or refunded.
BALANCED_CASES = (0, 3, 4, 5, 6, 7)
# Three refundable (one recent, two 22-30 days old), three late (31-40, 41-60 through
# `_case`'s kind 8, and 41-180, mostly past 60), one shipping, one processing or refunded.
PAST_CASES = (0, 3, 3, 4, 8, 5, 6, 7)
# Three refundable, each 0-30 days old with every age as likely (`_case`'s kind 9), three
# late (two 31-60 days old alike, kind 10; one 41-180, kind 5), one shipping, one processing
# or refunded: PAST_CASES's shape with the ages spread evenly on either side of the line.
EVEN_CASES = (9, 9, 9, 10, 10, 5, 6, 7)
# BALANCED_CASES plus one more refundable recent (0) and one delivered 100-180 days ago
# (`_case`'s kind 11): delivered copies still refused as often as refunded, and a
# three-digit age beginning with 1 shown about as often as a teen age.
OLD_CASES = (0, 0, 3, 4, 5, 11, 6, 7)
VARIANT_CASES = {
    "all": tuple(range(8)),
    "balanced": BALANCED_CASES,
    "past": PAST_CASES,
    "even": EVEN_CASES,
    "old": OLD_CASES,
}
