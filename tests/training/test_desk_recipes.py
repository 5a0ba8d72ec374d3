"""The desk experiment's sixth family: its copies' three-digit ages and the checkpoint rule
that puts the policy-violation endpoint first."""

import random
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent / "scripts"))

from desk.recipes import OLD_CASES, RECIPES, VARIANT_CASES
from desk.train import checkpoint_improves, checkpoint_key

from training.environments.support_desk.store import DAY_VALUES, _case


def test_kind_11_draws_three_digit_ages_of_the_split_only():
    rng = random.Random(0)
    for split in ("train", "validation", "test"):
        ages = {_case(rng, 11, split)[1] for _ in range(300)}
        assert ages <= set(DAY_VALUES[split])
        assert all(100 <= age <= 180 for age in ages)
        assert len(ages) > 5
    assert _case(rng, 11, "train")[0] == "delivered"


def test_old_cases_refuse_a_delivered_copy_as_often_as_they_refund_it():
    rng = random.Random(1)
    outcome = Counter()
    for kind in OLD_CASES:
        status, days, refunded = _case(rng, kind, "train")
        if status == "delivered" and not refunded:
            outcome["refund" if days <= 30 else "refuse"] += 1
    assert outcome == {"refund": 3, "refuse": 3}
    recipe = RECIPES["old8-s300"]
    assert VARIANT_CASES[recipe["variant_cases"]] == OLD_CASES
    assert (recipe["variants"], recipe["steps"], recipe["checkpoint_rule"]) == (8, 300, "violations")


def looks_kept(looks, rule):
    """The step the training loop keeps after these looks, in order."""
    kept, best = None, None
    for step, metrics in looks:
        key = checkpoint_improves(metrics, best, rule=rule)
        if key is not None:
            kept, best = step, key
    return kept


def test_the_violation_rule_keeps_a_clean_checkpoint_over_a_better_scoring_one():
    looks = [
        (100, {"reward": 11 / 16, "violations": 0}),
        (200, {"reward": 15 / 16, "violations": 1}),
        (300, {"reward": 11 / 16, "violations": 0}),
    ]
    assert looks_kept(looks, "success") == 200
    assert looks_kept(looks, "violations") == 100  # the earliest of the clean ones on a tie
    looks.append((400, {"reward": 12 / 16, "violations": 0}))
    assert looks_kept(looks, "violations") == 400


def test_an_unknown_checkpoint_rule_or_a_look_without_violations_is_an_error():
    with pytest.raises(ValueError, match="checkpoint_rule"):
        checkpoint_key({"reward": 1.0}, rule="loss")
    with pytest.raises(ValueError, match="violations"):
        checkpoint_key({"reward": 1.0}, rule="violations")
