"""Processes that do not outlive their launcher: a data-parallel job's torchrun and its
ranks (docs/decisions/0026-data-parallel-jobs.md). No Django, no torch."""

from __future__ import annotations

import ctypes
import os

_PR_SET_PDEATHSIG = 1


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
