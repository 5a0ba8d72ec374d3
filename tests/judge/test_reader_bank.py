"""`scripts/reader_bank.py`: a reader's actions on the comment bank, read through the
product's path, from the validation split's contexts unless asked; a read of the test
split's is a look at it, logged, and a second one refused without its reason."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
spec = importlib.util.spec_from_file_location("reader_bank", ROOT / "scripts" / "reader_bank.py")
reader_bank = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reader_bank)


def _answer_reply(request) -> dict:
    return {
        "rationale": "The rule says no.",
        "action": {"kind": "reply", "text": "It cannot be refunded."},
        "reward": 0.5,
    }


@pytest.mark.django_db
def test_the_readers_bank_reads_validation_by_default_and_logs_a_look_at_the_test_split(judge_server, tmp_path, capsys):
    from training.promotion.evaluation.split_looks import split_looks

    judge_server.respond_with(_answer_reply)
    looks, log = tmp_path / "looks.jsonl", tmp_path / "rows.jsonl"
    common = [
        "--judge-url",
        judge_server.base_url,
        "--judge-model",
        "judge",
        "--looks-log",
        str(looks),
        "--log",
        str(log),
    ]

    assert reader_bank.main(common) == 0
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 30 and {r["split"] for r in rows} == {"validation"}
    assert not looks.exists()  # the validation split is where readers are chosen: no look
    # Every comment asks for a change: the reader that always replies is right on those asking for one.
    assert sum(r["right"] for r in rows) == sum(r["wanted"] == "reply" for r in rows)

    assert reader_bank.main([*common, "--split", "test"]) == 0
    (look,) = split_looks(looks)
    assert look["family"] == "reader-bank (judge)" and look["seeds"] == [0]
    assert look["script"] == "scripts/reader_bank.py" and "--split" in look["argv"]
    asked = len(judge_server.requests)

    # A second read of the test split is refused before any judgement, whatever its seed
    # (another seed deals the same contexts to the comments another way), unless given its reason.
    assert reader_bank.main([*common, "--split", "test", "--seed", "1"]) == 2
    assert "already measured for 'reader-bank (judge)'" in capsys.readouterr().err
    assert len(judge_server.requests) == asked and len(split_looks(looks)) == 1
    assert reader_bank.main([*common, "--split", "test", "--second-look", "the bank's wording changed"]) == 0
    assert split_looks(looks)[-1]["reason"] == "the bank's wording changed"
