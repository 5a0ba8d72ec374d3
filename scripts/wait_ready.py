"""Wait until a URL answers 200, saying on the console what is awaited as time passes.

    python scripts/wait_ready.py URL SECONDS WHAT [--log FILE] [--every S] [PID ...]

Every `--every` seconds (15) one line: how long it has waited, and the latest line of the
server's log (`--log`), which names the stage it is at (loading the weights, compiling,
warming up). Exits 0 once the URL answers 200; 1 when a PID exits first (a process of the
demo died) or SECONDS pass. No Django: `make demo` runs it before anything is up.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import urllib.request
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# vLLM's prefix ("INFO 12-06 09:41:02 [loader.py:58] "), a log level, a timestamp: not the stage.
PREFIX = re.compile(r"^(\(\w+ pid=\d+\)\s*)?([A-Z]+\s+)?(\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?\s+)?(\[[^\]]*\]\s*)?")


def log_stage(path: Path | None, *, limit: int = 100) -> str:
    """The latest non-empty line of the log at `path`, without colours and prefixes, cut
    to `limit` characters; "" when there is none yet."""
    if path is None:
        return ""
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        text = PREFIX.sub("", ANSI.sub("", line)).strip()
        if text:
            return text if len(text) <= limit else text[: limit - 1] + "…"
    return ""


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_ready(
    *, url: str, seconds: float, what: str, pids: list[int], log: Path | None = None, every: float = 15.0
) -> str:
    """ "" once `url` answers 200, else why not; prints a progress line every `every` s."""
    started = time.monotonic()
    next_line = started + every
    while True:
        if answers(url):
            return ""
        now = time.monotonic()
        waited = now - started
        if waited >= seconds:
            return f"{what} did not answer {url} within {seconds:.0f} s"
        for pid in pids:
            if not alive(pid):
                return f"a process of the demo exited while waiting for {what}: see the logs"
        if now >= next_line:
            stage = log_stage(log)
            where = f" — {log.name}: {stage}" if log is not None and stage else ""
            print(f"  … waiting for {what}: {waited:.0f} s{where}", flush=True)
            next_line += every
        time.sleep(0.2 if every < 2 else 0.5)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("seconds", type=float)
    parser.add_argument("what")
    parser.add_argument("pids", nargs="*", type=int)
    parser.add_argument("--log", type=Path)
    parser.add_argument("--every", type=float, default=15.0)
    args = parser.parse_intermixed_args(argv)
    problem = wait_ready(
        url=args.url, seconds=args.seconds, what=args.what, pids=args.pids, log=args.log, every=args.every
    )
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
