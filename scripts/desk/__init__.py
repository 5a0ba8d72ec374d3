"""The support-desk experiment's parts; `scripts/desk_experiment.py` is its command line.

`harness` plays the agent's turns under the tool-call regex in torch, `recipes` names the
training recipes, `items` builds their training sets, `train` runs one, `measure` plays and
counts episodes, `curve` reads the decision off a model, and `summary` prints the runs'
tables; here, what they share: the repository's root, the runs' folder and the log line.
torch, Django and the trainer are imported inside the functions that use them, so that a
script reading only a recipe or a summary loads none of them."""

from __future__ import annotations

import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
OUT = ROOT / "var" / "desk-experiment"


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)
