"""How long `make demo` takes to be ready, phase by phase, as a newcomer runs it after install.

    .venv/bin/python bench/startup.py            # make demo FAST=1: a fresh data folder, then the same again
    .venv/bin/python bench/startup.py --full     # make demo (SmolLM2-135M on vLLM)

Runs `scripts/demo.sh` (what `make demo` runs once `make install` is done) on the embedded
default (SQLite, Celery's filesystem broker: DATABASE_URL and CELERY_BROKER_URL are left
out), in a data folder of its own and on free ports, reads its console and times each phase
by the line that ends it: preparing the database and the model, the demo's setup,
the web server, the inference server, the demo agent's episodes, until the console says
"Ready". Then it stops the demo with a Ctrl-C to each of its process groups and waits for it
to exit. A run whose demo agent stopped early is an error, not a start-up time. The first
run starts from an empty data folder (the model is built or converted there); each later run
(`--runs`, default 2) reuses it, as a second `make demo` does. Prints each run's phases and
seconds to "Ready" beside the goal (2 minutes FAST, 5 minutes full), with the load average
before and after: the goals are for a quiet 2-core machine, and a loaded one only bounds
them from above.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from support import ROOT, free_port

sys.path.insert(0, str(ROOT))
from tests.fixtures.processes import descendants

# Each phase and the console lines that end it (scripts/demo.sh), in order. A later run on
# the same data folder finds the agent's episodes there and goes straight to "Ready".
PHASES = (
    ("database and model", re.compile(r"is ready \(details in")),
    ("demo setup, web server", re.compile(r"^The web server is up")),
    ("inference server", re.compile(r"^(The demo agent|The base model on|Ready:)")),
    ("demo agent", re.compile(r"^Ready:")),
)
# A demo agent that failed still ends in "Ready": such a run is no start-up time.
FAILED = re.compile(r"^the demo agent stopped early")
OUTSIDE = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "PRACTICUM_INFERENCE_URL",
    "PRACTICUM_MODELS_DIR",
    "FAST_DEMO",
    "PRACTICUM_DEMO_AGENT",
)
GOALS = {"fast": 120.0, "full": 300.0}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def load() -> str:
    return Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"


def one_run(data: Path, *, fast: bool, timeout: float) -> dict[str, float]:
    """Seconds from the start to the end of each phase (the last: the demo says "Ready")."""
    # A newcomer's environment: the embedded default, and nothing that points the demo at
    # another server, another model folder or the other kind of demo.
    env = {k: v for k, v in os.environ.items() if k not in OUTSIDE}
    env |= {
        "PRACTICUM_DATA_DIR": str(data),
        "PRACTICUM_PORT": str(free_port()),
        "PRACTICUM_INFERENCE_PORT": str(free_port()),
    }
    command = ["bash", "scripts/demo.sh", *(["--fast"] if fast else [])]
    start = time.perf_counter()
    demo = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own group: stopped as a terminal's Ctrl-C stops it
    )
    ended: dict[str, float] = {}
    log = data / "bench-console.log"
    # The console goes quiet while a phase waits: past the timeout the demo is stopped, which
    # ends its output and so the loop below.
    watchdog = threading.Timer(timeout, _signal_all, args=(demo.pid, signal.SIGINT))
    watchdog.start()
    try:
        with log.open("w", buffering=1) as out:
            for raw in demo.stdout:
                line = ANSI.sub("", raw).strip()
                now = time.perf_counter() - start
                out.write(f"{now:7.1f} {line}\n")
                for name, pattern in PHASES:
                    if name not in ended:  # the phase under way
                        if pattern.search(line):
                            ended[name] = now
                        break
                if FAILED.search(line):
                    break
                if PHASES[-1][1].search(line):  # "Ready" ends the phases it skipped too
                    ended = {name: ended.get(name, now) for name, _ in PHASES}
                if PHASES[-1][0] in ended:
                    break
    finally:
        watchdog.cancel()
        watchdog.join()
        _stop(demo)
    if PHASES[-1][0] not in ended:
        tail = "\n".join(log.read_text().splitlines()[-20:])
        why = "its demo agent stopped early" if FAILED.search(tail) else f"it was not ready within {timeout:.0f} s"
        raise SystemExit(f"no start-up time: {why} (exit {demo.returncode}):\n{tail}")
    return ended


def _groups(pid: int) -> set[int]:
    """The process groups of `pid` and of every process under it. With job control on
    (`set -m`), each service and each foreground wait of demo.sh has a group of its own, and
    bash holds a trapped Ctrl-C until its foreground command ends: signalling bash's group
    alone can leave the demo waiting for minutes, or its services running."""
    groups = set()
    for member in {pid} | descendants(pid):
        with contextlib.suppress(ProcessLookupError):
            groups.add(os.getpgid(member))
    return groups


def _signal_all(pid: int, sig: int) -> set[int]:
    groups = _groups(pid)
    for group in groups:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, sig)
    return groups


def _stop(demo: subprocess.Popen) -> None:
    """Ctrl-C to every group of the demo, as it stops on one; past 90 s, KILL to them all."""
    groups = _signal_all(demo.pid, signal.SIGINT)
    try:
        demo.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        for group in groups | _groups(demo.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        demo.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="make demo (SmolLM2) instead of make demo FAST=1")
    parser.add_argument("--runs", type=int, default=2, help="the first from an empty data folder, then reusing it")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a run may take to be ready")
    args = parser.parse_args()
    kind = "full" if args.full else "fast"
    print(f"make demo{'' if args.full else ' FAST=1'} (scripts/demo.sh), load average {load()} before")
    totals = []
    with tempfile.TemporaryDirectory(prefix="practicum-startup-") as folder:
        for i in range(args.runs):
            ended = one_run(Path(folder), fast=not args.full, timeout=args.timeout)
            parts, before = [], 0.0
            for name, _ in PHASES:
                parts.append(f"{name} {ended[name] - before:.0f} s")
                before = ended[name]
            what = "an empty data folder" if i == 0 else "the same data folder again"
            total = ended[PHASES[-1][0]]
            print(f"  run {i + 1}, {what}: ready in {total:.0f} s ({', '.join(parts)})")
            totals.append(total)
    goal = GOALS[kind]
    print(f"goal: ready in {goal:.0f} s on a quiet 2-core machine; longest run here {max(totals):.0f} s")
    print(f"load average {load()} after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
