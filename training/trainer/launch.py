"""Processes that do not outlive their launcher: a data-parallel job's torchrun and its
ranks (docs/decisions/0026-data-parallel-jobs.md). No Django, no torch."""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
from pathlib import Path

_PR_SET_PDEATHSIG = 1
# The environment variable that marks every process of one launch: its value is the launch's tag.
LAUNCH_TAG = "PRACTICUM_LAUNCH"


def _prctl():
    """The C library's prctl, or None where there is none (not Linux)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def parent_death_signal_setter(sig: int):
    """A function that makes the calling process receive `sig` when its parent dies (Linux's
    PR_SET_PDEATHSIG; None elsewhere), resolved now so that a forked child only calls it.

    The worker's torchrun gets SIGTERM when the worker dies (torchrun then stops its
    processes), and each `train_rank` process SIGKILL when torchrun dies (torchrun starts
    them in sessions of their own, so nothing else reaches them): a job's processes never
    outlive the worker that holds it, training on beside the next job it takes."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()

    def set_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was set
            os.kill(os.getpid(), sig)

    return set_signal


def parent_death_signal(sig: int) -> None:
    """Receive `sig` when this process's parent dies (see `parent_death_signal_setter`)."""
    prctl = _prctl()
    if prctl is None:
        return
    prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() == 1:  # already orphaned: the launcher is gone
        os.kill(os.getpid(), sig)


def launch_tag(job_id: int) -> str:
    """A tag of its own for one launch of a job's processes (`LAUNCH_TAG` in their
    environment, which every process they start inherits)."""
    return f"job{job_id}-{secrets.token_hex(6)}"


def tagged_stop(tag: str) -> list[int]:
    """SIGKILL every process whose environment carries `LAUNCH_TAG`=`tag`, and return their
    pids: what a launch left behind once its torchrun has ended. A process that a rank
    started and that has no parent-death signal of its own (a vLLM engine's core) outlives
    a rank killed outright, holding its memory and its share of a GPU; its environment
    still says whose it is. Reads /proc (Linux); elsewhere nothing is found."""
    needle = f"{LAUNCH_TAG}={tag}".encode()
    proc = Path("/proc")
    stopped: list[int] = []
    if not proc.is_dir():
        return stopped
    for entry in proc.iterdir():
        if not (entry.name.isascii() and entry.name.isdigit()) or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()  # a zombie's reads empty
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)
                stopped.append(int(entry.name))
    return stopped
