"""The test split's looks: each time a script measures a recipe family on the test split, one
line is appended to a log (`docs/experiments/test-split-looks.jsonl`), so how often the test
was looked at, and by what, is on record beside the figures.

The protocol (docs/explanation/evidence.md): recipes and checkpoints are chosen on the
validation split; the test split is measured once per recipe family, after the choice. A
second look at a family that was already measured must give its reason, which is logged
with it. Pure Python: no database, no torch.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
LOG = ROOT / "docs" / "experiments" / "test-split-looks.jsonl"


class SecondLook(RuntimeError):
    """The recipe family was already measured on the test split and no reason was given."""


def split_looks(path: Path = LOG) -> list[dict[str, Any]]:
    """Every look logged at `path`, oldest first."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def split_look_check(*, family: str, seeds: list[int] | None = None, reason: str = "", path: Path = LOG) -> None:
    """Refuse (`SecondLook`) a look at `family` on the test split when one is logged already
    (for any of `seeds`, when given: a family's seeds may run one at a time) and no `reason`
    is given."""
    earlier = [
        look
        for look in split_looks(path)
        if look.get("family") == family and (seeds is None or set(seeds) & set(look.get("seeds") or []))
    ]
    if earlier and not reason.strip():
        when = ", ".join(f"{look.get('at', '?')} (seeds {look.get('seeds')})" for look in earlier)
        raise SecondLook(
            f"the test split was already measured for {family!r}: {when}; choose on the validation split, "
            "or give the reason for another look"
        )


def split_look_record(
    *, family: str, script: str, argv: list[str], seeds: list[int], reason: str = "", path: Path = LOG
) -> dict[str, Any]:
    """Append one look at the test split to the log and return it."""
    look = {
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "family": family,
        "script": script,
        "argv": list(argv),
        "seeds": list(seeds),
        "commit": _commit(),
        "look": 1 + sum(1 for x in split_looks(path) if x.get("family") == family),
        **({"reason": reason.strip()} if reason.strip() else {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(look) + "\n")
    return look


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()
