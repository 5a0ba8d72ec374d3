"""Data-parallel training over processes (torch.distributed, launched by torchrun): which
items of a global batch this process takes, how its samples are seeded, and the few
collectives the loop needs.

A job with `processes: N` runs N copies of the one loop. Process r takes items r::N of
every global batch; each item is sampled from a generator seeded by the job's seed, the
step and the item's place in the global batch (never by the process); each process scales
its loss by its share of the global batch's normaliser, and the trainable parameters'
gradients are summed over the processes before clipping. Every process then steps the same
optimizer on the same gradient, so their parameters stay equal, and equal to what one
process computes on the whole batch, up to float rounding.

`Ranks()` (one process) makes every collective a no-op that returns its input: a
one-process job runs the arithmetic it always ran.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib
import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist


class GroupBroken(RuntimeError):
    """A collective failed: another process of the job died, left, or was silent past the
    timeout. The process that sees it is not the cause, so it names none: the launcher
    knows which process failed first, and why."""


def _broken(exc: BaseException) -> GroupBroken:
    return GroupBroken(f"GroupBroken: {type(exc).__name__}: {str(exc)[:300]}")


def collective(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise _broken(exc) from exc


def gathering(fn, *args, **kwargs):
    """`collective` for a call that also computes (gathering a sharded state): only a
    failed communication (a `RuntimeError` from the backend) is `GroupBroken`; an
    out-of-memory error or a bug (a `KeyError`, a `ValueError`) is this process's own, and
    is raised as it is, so the job fails with it rather than with a broken group."""
    try:
        return fn(*args, **kwargs)
    except torch.OutOfMemoryError:
        raise
    except RuntimeError as exc:
        raise _broken(exc) from exc


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job's process group: `rank` of `size`; `device` is where
    the collectives' tensors live (the GPU for nccl, the CPU for gloo)."""

    rank: int = 0
    size: int = 1
    device: str = "cpu"

    @property
    def owner(self) -> bool:
        """Rank 0 owns the job: its row, its events, checkpoints, evaluations and export."""
        return self.rank == 0

    def shard(self, batch: list) -> list:
        """This process's items of a global batch: r, r + N, r + 2N, …"""
        return batch[self.rank :: self.size]

    def global_index(self, local: int) -> int:
        """The place in the global batch of this process's `local`-th item."""
        return local * self.size + self.rank

    def sum(self, *values: float) -> list[float]:
        """Each value summed over the processes (in float64)."""
        if self.size == 1:
            return [float(v) for v in values]
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        collective(dist.all_reduce, tensor)
        return tensor.tolist()

    def gather(self, value: Any) -> list[Any]:
        """Every process's `value` (picklable), in rank order."""
        if self.size == 1:
            return [value]
        out: list[Any] = [None] * self.size
        collective(dist.all_gather_object, out, value)
        return out

    def agree(self, decision: bool) -> bool:
        """Rank 0's decision, on every process: only the owner reads the job row (a cancel)
        and runs the evaluations (canaries), so it alone decides when the loop stops."""
        if self.size == 1:
            return decision
        flag = torch.tensor([1 if decision else 0], dtype=torch.int64, device=self.device)
        collective(dist.broadcast, flag, src=0)
        return bool(flag.item())

    def gradients_sum(self, parameters: list[torch.nn.Parameter]) -> None:
        """Sum the parameters' gradients over the processes, in place, in one flat buffer.

        Each process's loss is already its share of the global batch's loss, so the sum is
        the global batch's gradient. A parameter without a gradient counts as zeros and gets
        the sum: the optimizer must step every parameter on every process alike."""
        if self.size == 1 or not parameters:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in parameters]
        flat = torch.cat([g.reshape(-1) for g in grads])
        collective(dist.all_reduce, flat)
        offset = 0
        for p in parameters:
            p.grad = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()

    def parameters_broadcast(self, parameters: list[torch.nn.Parameter]) -> None:
        """Rank 0's starting weights on every process. Each process seeds and builds the same
        model, so this changes nothing unless an initialisation drew from another stream."""
        if self.size == 1:
            return
        with torch.no_grad():
            for p in parameters:
                collective(dist.broadcast, p.data, src=0)


def ranks_current() -> Ranks:
    """The process group torch.distributed was initialised with, or one process."""
    if not (dist.is_available() and dist.is_initialized()):
        return Ranks()
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    return Ranks(rank=dist.get_rank(), size=dist.get_world_size(), device=device)


# Every torch module whose import evaluates `dist.group.WORLD` into a default argument.
_BINDS_THE_GROUP = ("torch.distributed.fsdp", "torch.distributed.nn", "torch.distributed.optim")


def process_group_init(*, cuda: bool, timeout_seconds: float) -> Ranks:
    """Join the process group torchrun describes in the environment (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT): nccl with one GPU per local rank when `cuda`,
    else gloo. `timeout_seconds` bounds every collective: a process that hangs (rather
    than dies, which its peers see at once) fails the group after it."""
    # These modules evaluate `dist.group.WORLD` into a function default when imported:
    # imported after the join (as loading a model does), they hold the group past
    # `destroy_process_group`, so its gloo threads run on into the interpreter's exit, where
    # sharded jobs' processes were seen to abort ("terminate called without an active
    # exception"). Imported first, they hold None.
    for module in _BINDS_THE_GROUP:
        importlib.import_module(module)
    timeout = timedelta(seconds=timeout_seconds)
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    return ranks_current()


def process_group_close(*, together: bool = False) -> None:
    """Leave the process group. `together`: every process got to the same end (the loop
    finished, or stopped, on all of them), so they first wait for each other and tear the
    group down with no collective of a peer still in flight; a process that tore its end down
    while another was still inside FSDP2's last collectives was seen to abort at exit
    ("terminate called without an active exception"). After a failure there is no such
    wait: a peer may be stuck elsewhere, or gone."""
    if dist.is_available() and dist.is_initialized():
        if together:
            with contextlib.suppress(GroupBroken):  # the others are already gone: nothing to wait for
                collective(dist.barrier)
        dist.destroy_process_group()


def process_exit(code: int) -> NoReturn:
    """End a job's process, after `process_group_close`, without the interpreter's
    finalization. A sharded model's device mesh stays referenced by DTensor's caches, and
    the mesh holds the process group, so `destroy_process_group` cannot join gloo's
    threads: they are still running when the interpreter finalizes, and a process was seen
    to abort there ("terminate called without an active exception", 1 in about 30 sharded
    runs). Output (Python's and C's) is flushed and logging shut down first; the launcher
    reads `code`."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing left to say
            stream.flush()
    logging.shutdown()
    with contextlib.suppress(Exception):  # what native code wrote through C's stdio, which _exit drops
        ctypes.CDLL(None).fflush(None)
    os._exit(code)


def _item_digest(*, seed: int, step: int, index: int) -> int:
    digest = hashlib.sha256(f"practicum-sample:{seed}:{step}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def item_generator(*, seed: int, step: int, index: int) -> torch.Generator:
    """The random stream of the item at `index` of step `step`'s global batch: the same
    draws whichever process samples it and whichever items share its local batch."""
    return torch.Generator().manual_seed(_item_digest(seed=seed, step=step, index=index) & (2**63 - 1))


def item_generators(ranks: Ranks, *, seed: int, step: int, count: int) -> list[torch.Generator]:
    """One generator per item of this process's `count` items of step `step`."""
    return [item_generator(seed=seed, step=step, index=ranks.global_index(k)) for k in range(count)]


def item_seeds(ranks: Ranks, *, seed: int, step: int, count: int) -> list[int]:
    """The inference server's request seed for each of this process's `count` items of
    step `step`: the item's stream in the global batch, as `item_generators`, in 31 bits
    (the server adds a choice's index to it)."""
    return [_item_digest(seed=seed, step=step, index=ranks.global_index(k)) & (2**31 - 1) for k in range(count)]


@dataclass
class SeenRollout:
    """The global batch's samples, gathered from every process for the step's figures
    (`common.rollout_stats` reads the same attributes from a `Rollout`)."""

    texts: list[str]
    lengths: torch.Tensor  # (B,)
    truncated: list[bool]
    rewards: list[float]
    keep: torch.Tensor  # (N,) the groups that carried signal


def rollout_seen(ranks: Ranks, rollout, *, rewards: list[float] | None = None, keep=None) -> SeenRollout:
    """`rollout` (and its rewards, and which groups were kept) over every process."""
    local = (
        rollout.texts,
        rollout.lengths.tolist(),
        list(rollout.truncated),
        list(rewards or []),
        [] if keep is None else keep.tolist(),
    )
    parts = ranks.gather(local)
    if ranks.size == 1:
        return SeenRollout(
            texts=rollout.texts,
            lengths=rollout.lengths,
            truncated=list(rollout.truncated),
            rewards=list(rewards or []),
            keep=keep if keep is not None else torch.ones(0, dtype=torch.bool),
        )
    return SeenRollout(
        texts=[t for p in parts for t in p[0]],
        lengths=torch.tensor([n for p in parts for n in p[1]]),
        truncated=[t for p in parts for t in p[2]],
        rewards=[r for p in parts for r in p[3]],
        keep=torch.tensor([k for p in parts for k in p[4]], dtype=torch.bool),
    )
