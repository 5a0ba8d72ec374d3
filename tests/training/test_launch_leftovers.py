"""What a launch's processes leave running once torchrun has ended (a process a rank started
and that outlived it) is found by the launch's tag and stopped; nothing else is."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.trainer.launch import LAUNCH_TAG, launch_tag, tagged_stop

# A "rank" that starts a "server core" in a session of its own (out of reach of its
# process group) and exits at once, leaving it running.
RANK = """
import subprocess, sys
core = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(120)"],
    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
print(core.pid, flush=True)
"""


def _orphan(tag: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", RANK], env=os.environ | {LAUNCH_TAG: tag}, capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds the processes through /proc (Linux)")
def test_the_processes_a_launch_left_running_are_stopped_and_no_others():
    tag, other_tag = launch_tag(7), launch_tag(7)
    left, other = _orphan(tag), _orphan(other_tag)
    assert tag != other_tag and _alive(left) and _alive(other)

    stopped = tagged_stop(tag)

    assert stopped == [left]
    deadline = time.monotonic() + 10
    while _alive(left) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(left) and _alive(other)  # another launch's (another job's) is not touched
    assert tagged_stop(other_tag) == [other]
