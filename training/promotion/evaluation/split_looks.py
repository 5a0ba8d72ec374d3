"""The test split's looks: each time a script measures a recipe family on the test split, one
line is appended to a log (`docs/experiments/test-split-looks.jsonl`), so how often the test
was looked at, and by what, is on record beside the figures.

The protocol (docs/explanation/evidence.md): recipes and checkpoints are chosen on the
validation split; the test split is measured once per recipe family, after the choice. A
second look at a family that was already measured must give its reason, which is logged
with it. Pure Python: no database, no torch.
"""

from __future__ import annotations

import fcntl
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
    """Every look logged at `path`, oldest first (a line another process is still writing,
    with no newline yet, is not one)."""
    if not path.exists():
        return []
    return _parsed(path.read_text())


def _parsed(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def _earlier(looks: list[dict[str, Any]], *, family: str, seeds: list[int] | None) -> list[dict[str, Any]]:
    """The looks at `family` already logged (for any of `seeds`, when given)."""
    return [
        look
        for look in looks
        if look.get("family") == family and (seeds is None or set(seeds) & set(look.get("seeds") or []))
    ]


def _refusal(looks: list[dict[str, Any]], *, family: str, seeds: list[int] | None, reason: str) -> str | None:
    earlier = _earlier(looks, family=family, seeds=seeds)
    if not earlier or reason.strip():
        return None
    when = ", ".join(f"{look.get('at', '?')} (seeds {look.get('seeds')})" for look in earlier)
    return (
        f"the test split was already measured for {family!r}: {when}; choose on the validation split, "
        "or give the reason for another look"
    )


def split_look_check(*, family: str, seeds: list[int] | None = None, reason: str = "", path: Path = LOG) -> None:
    """Refuse (`SecondLook`) a look at `family` on the test split when one is logged already
    (for any of `seeds`, when given: a family's seeds may run one at a time; None: whatever
    its seeds) and no `reason` is given. A check ahead of a long run; `split_look_take`
    checks again as it records."""
    if refusal := _refusal(split_looks(path), family=family, seeds=seeds, reason=reason):
        raise SecondLook(refusal)


def split_look_record(
    *, family: str, script: str, argv: list[str], seeds: list[int], reason: str = "", path: Path = LOG
) -> dict[str, Any]:
    """Append one look at the test split to the log and return it."""
    return _locked_append(
        family=family, script=script, argv=argv, seeds=seeds, reason=reason, path=path, check=False, refuse_seeds=seeds
    )


def split_look_take(
    *,
    family: str,
    script: str,
    argv: list[str],
    seeds: list[int],
    reason: str = "",
    path: Path = LOG,
    per_seed: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    """Check and record one look in one step, under a lock on the log: of two processes that
    passed `split_look_check` hours ago for the same family and seed, the second is refused
    here (`SecondLook`), just before it would measure. `per_seed=False`: an earlier look
    at the family with any seeds refuses it (where the seed does not change what is read).
    `extra` goes into the line as it is (the run's id, the commit the run started at)."""
    return _locked_append(
        family=family,
        script=script,
        argv=argv,
        seeds=seeds,
        reason=reason,
        path=path,
        check=True,
        refuse_seeds=seeds if per_seed else None,
        **extra,
    )


def _locked_append(
    *,
    family: str,
    script: str,
    argv: list[str],
    seeds: list[int],
    reason: str,
    path: Path,
    check: bool,
    refuse_seeds: list[int] | None,
    **extra: Any,
) -> dict[str, Any]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as f:
        # Processes of one run record beside each other: the lock keeps the check, the
        # look's number and the line one step.
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        looks = _parsed(f.read())
        if check and (refusal := _refusal(looks, family=family, seeds=refuse_seeds, reason=reason)):
            raise SecondLook(refusal)
        earlier = _earlier(looks, family=family, seeds=refuse_seeds)
        look = {
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "family": family,
            "script": script,
            "argv": list(argv),
            "seeds": list(seeds),
            "commit": extra.pop("commit", None) or repository_commit(),
            "look": 1 + sum(1 for x in looks if x.get("family") == family),
            **extra,
            # A reason is kept where it explains something: a look after an earlier one.
            **({"reason": reason.strip()} if reason.strip() and earlier else {}),
        }
        f.write(json.dumps(look) + "\n")
        f.flush()
    return look


def repository_commit() -> str:
    """The short id of the checked-out commit ("" outside a repository)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip()
