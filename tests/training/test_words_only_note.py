"""Issue 39's words-only arm on the support desk: decision points labelled by a policy note
alone (`desk_experiment.note_items`), and the check that refuses a set with any other label."""

from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
spec = importlib.util.spec_from_file_location("desk_experiment", ROOT / "scripts" / "desk_experiment.py")
desk = importlib.util.module_from_spec(spec)
sys.modules.setdefault(spec.name, desk)
spec.loader.exec_module(desk)

from training.environments.policy_rules import rule_from_text  # noqa: E402
from training.environments.support_desk import SupportDesk  # noqa: E402

TEXT = "We refund delivered orders for 30 days."
WINDOW = rule_from_text("status = delivered and days_since_delivery <= 30 -> refund; otherwise -> answer")
# A note that got the line wrong: what it labels is what training sees.
TWENTY = rule_from_text("status = delivered and days_since_delivery <= 20 -> refund; otherwise -> answer")


def _actions(item) -> bool:
    return item.target.startswith("<tool_call>")


@pytest.mark.parametrize("rule", [WINDOW, TWENTY])
def test_every_target_is_the_notes_label_and_the_copies_split_evenly_on_its_line(rule):
    tasks = SupportDesk().tasks_for(split="train", graded=True)[:24]
    items = desk.note_items(tasks, rule=rule, text=TEXT, variants=6, rng=random.Random(0))
    desk.words_only_check(items, rule=rule, text=TEXT)
    assert len(items) == 24 * 7  # each order's own decision point and 6 copies
    copies = [i for i in items if ":v" in i.id]
    assert sum(map(_actions, copies)) == len(copies) // 2  # the note's own line splits them
    line = 30 if rule is WINDOW else 20
    for item in items:
        row = json.loads(item.messages[-1]["content"])
        refund = row["status"] == "delivered" and row["delivered_days_ago"] <= line
        assert _actions(item) == refund, item.id
        assert item.messages[-1]["role"] == "tool" and row["order_id"] in item.target


def test_a_set_with_a_label_the_note_does_not_give_is_refused():
    """A refund at 25 days, as the hidden policy would label it, where the note refuses:
    the set is refused."""
    tasks = SupportDesk().tasks_for(split="train", graded=True)[:12]
    items = desk.note_items(tasks, rule=TWENTY, text=TEXT, variants=6, rng=random.Random(1))
    desk.words_only_check(items, rule=TWENTY, text=TEXT)
    between = next(
        i for i in items if 20 < (json.loads(i.messages[-1]["content"]).get("delivered_days_ago") or 0) <= 30
    )
    order_id = json.loads(between.messages[-1]["content"])["order_id"]
    between.target, between.reference = desk.note_turn(order_id, True, TEXT)
    with pytest.raises(SystemExit, match="not a words-only set"):
        desk.words_only_check(items, rule=TWENTY, text=TEXT)
