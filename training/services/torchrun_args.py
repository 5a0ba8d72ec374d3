"""What a job's torchrun arguments (`PRACTICUM_TRAINING_TORCHRUN_ARGS`) say about its
group: how many nodes, whether a group of that size fits a step, and whether this machine
can join as another node. Pure reading of the arguments, shared by the worker and `train_node`."""

from __future__ import annotations

import re
import shlex


class NodeError(Exception):
    """This machine cannot join the job's processes; the message says why."""


def _count(value: str | None) -> int | None:
    """A node count as torchrun reads it: ASCII digits (`isdigit()` also takes "²", which `int()` refuses)."""
    return int(value) if value and re.fullmatch(r"[0-9]{1,9}", value) else None


def _option(words: list[str], name: str) -> str | None:
    """The value of torchrun option `name` in `words` (its last one, as torchrun reads them)."""
    value = None
    for i, word in enumerate(words):
        if word == name and i + 1 < len(words):
            value = words[i + 1]
        elif word.startswith(name + "="):
            value = word.split("=", 1)[1]
    return value


def node_count(args: str) -> int:
    try:
        value = _option(shlex.split(args), "--nnodes")
    except ValueError:
        return 1
    return _count(value) or 1


def group_size_problem(args: str, processes: int, prompts_per_step: int) -> str | None:
    """Why a group of `processes` per node over the launch's nodes cannot share the batch:
    every process needs at least one of the step's prompts."""
    total = node_count(args) * processes
    if total > prompts_per_step:
        return (
            f"the group has {total} processes ({node_count(args)} nodes of {processes}) but a step has "
            f"{prompts_per_step} prompts: every process needs one (raise prompts_per_step or use fewer)"
        )
    return None


def node_launch_check(args: str, node_rank: int) -> None:
    """Why this machine cannot be node `node_rank` of a group launched with `args`
    (`TRAINING_TORCHRUN_ARGS`), if it cannot. The worker's node must be node 0, whose first
    process owns the job: only a static rendezvous (`--nnodes M --node-rank 0 --master-addr
    HEAD --master-port P`) fixes that; a dynamic one (c10d, etcd) gives rank 0 to whichever
    node joins first, which may be this one."""
    try:
        words = shlex.split(args)
    except ValueError as exc:
        raise NodeError(f"PRACTICUM_TRAINING_TORCHRUN_ARGS cannot be read: {exc}") from None
    nodes = _option(words, "--nnodes")
    if "--standalone" in words or nodes is None:
        raise NodeError(
            "PRACTICUM_TRAINING_TORCHRUN_ARGS names no other node (it needs --nnodes, --master-addr and "
            f"--master-port, not {args!r}): the job's processes all run on the worker's machine"
        )
    backend = _option(words, "--rdzv-backend") or _option(words, "--rdzv_backend") or "static"
    if backend != "static":
        raise NodeError(
            f"the {backend} rendezvous gives rank 0, which owns the job, to whichever node joins first: "
            "use a static one (--nnodes M --node-rank 0 --master-addr HEAD --master-port P on the worker)"
        )
    count = _count(nodes)
    if count is None or not 1 <= node_rank < count:
        raise NodeError(f"--node-rank must be from 1 to {count - 1 if count is not None else 'nnodes - 1'}")
