"""The bank of comments no template wrote: its proportions, that every phrasing is about the
decision it claims, that it shares no sentence with the simulated lead, and that no training
path reads it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from training.environments import support_operator
from training.environments.comment_bank import bank_cases, bank_check, comment_bank
from training.environments.support_desk import SupportDesk

ROOT = Path(__file__).resolve().parents[2]


def test_bank_has_twenty_phrasings_a_fifth_vague_a_tenth_wrong():
    bank = comment_bank()
    assert len(bank) >= 20
    kinds = [c.kind for c in bank]
    assert kinds.count("vague") / len(bank) == pytest.approx(0.2, abs=0.02)
    assert kinds.count("wrong") / len(bank) == pytest.approx(0.1, abs=0.02)


def test_bank_shares_no_phrasing_with_the_simulated_lead():
    templates = [
        t for name, v in vars(support_operator).items() if name.startswith("_") and isinstance(v, list) for t in v
    ]
    assert templates
    words = lambda s: set(re.findall(r"[a-z']+", s.lower()))  # noqa: E731
    for comment in comment_bank():
        for template in templates:
            assert comment.text != template
            # Not a template with a word or two changed.
            overlap = len(words(comment.text) & words(template)) / max(1, len(words(comment.text)))
            assert overlap < 0.8, (comment.id, template)


def test_each_case_asks_what_its_kind_says_against_the_policy():
    desk = SupportDesk()
    contexts = desk.decision_contexts(tasks=desk.tasks_for(split="test", graded=True), per_point=1)
    cases = bank_cases(contexts=contexts)
    assert len(cases) == len(comment_bank())
    for case in cases:
        assert case.context.messages[-1]["role"] == "tool"
        assert "{" not in case.body
        if case.comment.kind == "specific":
            assert case.asks == case.right, case.comment.id
        elif case.comment.kind == "wrong":
            assert case.asks is not None and case.asks != case.right, case.comment.id
        else:
            assert case.asks is None


def test_a_malformed_entry_is_refused_naming_it():
    good = {"id": "a", "kind": "specific", "fits": "late", "asks": "reply", "text": "No refund for {id}."}
    assert bank_check({"comments": [good]})[0].id == "a"
    with pytest.raises(ValueError, match=r"comments\[1\]: needs an id of its own"):
        bank_check({"comments": [good, good]})
    with pytest.raises(ValueError, match="vague comment asks for nothing"):
        bank_check({"comments": [{**good, "kind": "vague"}]})
    with pytest.raises(ValueError, match="may only name"):
        bank_check({"comments": [{**good, "text": "{customer_secret}"}]})


def test_no_training_path_reads_the_bank():
    readers = []
    for path in [*ROOT.glob("training/**/*.py"), *ROOT.glob("feedback/**/*.py"), *ROOT.glob("webapp/**/*.py")]:
        if path.name == "comment_bank.py":
            continue
        text = path.read_text(encoding="utf-8")
        if "comment_bank" in text:
            readers.append(str(path.relative_to(ROOT)))
    assert readers == []
