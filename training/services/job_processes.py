"""Data-parallel training jobs (`processes` > 1): the worker that claimed the job runs
torchrun, which starts `manage.py train_rank` once per process; the worker waits for it.

- Rank 0 runs the job as a one-process worker does, under the worker's name: heartbeat,
  phases, events, metrics, checkpoints, the cancel flag, the candidate version.
- The other ranks train their shards of every batch and write nothing to the job.
- When any process dies or fails, torchrun stops the others and exits non-zero; the
  worker then ends the job failed, naming the process and why (unless rank 0 already
  ended it with its own error). A job is never left running by a broken group.

docs/decisions/0026-data-parallel-jobs.md has the why.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, connection

from training.models import JobEventKind, TrainingJob
from training.services.job_runner import (
    job_end_logged,
    job_event_add,
    job_heartbeat,
    job_run_dir,
    job_train,
    training_job_held_run,
)
from training.services.torchrun_args import NodeError, group_size_problem, node_count, node_launch_check
from training.trainer.config import ConfigError, config_from_dict
from training.trainer.launch import LAUNCH_TAG, launch_tag, parent_death_signal_setter, tagged_stop
from webapp.kernel.work import WorkStatus

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]
LOG_NAME = "processes.log"
NODE_LOG_NAME = "processes-node{node}.log"  # a joining node's torchrun, in the shared run folder
# Written by rank 0 once every process of every node has joined the group: until then a
# cancel cannot reach the loop (rank 0 reads the flag between steps), so the worker stops
# the processes itself.
JOINED_NAME = "processes.joined"
STOP_GRACE_SECONDS = 30.0  # how long torchrun gets to stop its processes after SIGTERM


def torchrun_command(*, job_id: int, worker: str, processes: int) -> list[str]:
    """The launch of a job's processes: torchrun (`TRAINING_TORCHRUN_ARGS`, one node by
    default; a one-process job on this node alone) with no restarts, each process running
    `manage.py train_rank`."""
    if processes == 1:
        extra = ["--standalone"]
    else:
        extra = shlex.split(settings.TRAINING_TORCHRUN_ARGS.replace("{job}", str(job_id)))
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *extra,
        "--nproc-per-node",
        str(processes),
        "--max-restarts",
        "0",
        str(ROOT / "manage.py"),
        "train_rank",
        "--job",
        str(job_id),
        "--worker",
        worker,
    ]


def training_job_processes_run(job: TrainingJob, worker: str, *, poll_seconds: float = 1.0) -> str:
    """Run a claimed job in `processes` torchrun processes and end it if they could not.
    Returns the job's final status, or "skipped" when another worker has it now.

    A cancel asked before the group has formed (another node has not joined yet) stops
    torchrun and ends the job cancelled: the loop that would read the flag is not running."""
    config = config_from_dict(job.config)
    processes = config.processes  # validated: 1 (a colocated engine's job) to MAX_PROCESSES
    run_dir = job_run_dir(job)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / LOG_NAME
    joined = run_dir / JOINED_NAME
    joined.unlink(missing_ok=True)  # an earlier attempt's
    args = settings.TRAINING_TORCHRUN_ARGS if processes > 1 else "--standalone"
    problem = group_size_problem(args, processes, config.prompts_per_step)
    if problem is not None:
        job_end_logged(job.pk, worker, status=WorkStatus.FAILED, error=problem, message=f"failed: {problem}")
        return WorkStatus.FAILED
    what = f"{processes} training processes" if processes > 1 else "the training process"
    job_event_add(job.pk, JobEventKind.LOG, job.step, {"message": f"starting {what} (torchrun)"})
    stop_beat = threading.Event()
    # Rank 0 beats too, once it runs; this covers the start (imports, the model's load).
    beat = threading.Thread(target=job_heartbeat, args=(job.pk, worker, stop_beat), daemon=True)
    beat.start()
    tag = launch_tag(job.pk)
    try:
        with open(log_path, "ab") as out:
            launched = subprocess.Popen(
                torchrun_command(job_id=job.pk, worker=worker, processes=processes),
                cwd=ROOT,
                env=os.environ | {LAUNCH_TAG: tag},
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=parent_death_signal_setter(signal.SIGTERM),
            )
            code = _supervise(
                launched, poll_seconds, stop=lambda: not _formed(joined, worker) and _unformed_stop(job.pk, worker)
            )
    finally:
        stop_beat.set()
        beat.join(timeout=5)
        _leftovers_stop(job.pk, tag)
    if code is None:  # cancelled, or lost, before the group formed
        message = "cancelled before every node joined: the training processes were stopped"
        job_end_logged(job.pk, worker, status=WorkStatus.CANCELLED, message=message)
    else:
        if code == 0:
            reason = "the training processes exited without ending the job"
        else:
            reason = processes_failure(log_path.read_text(errors="replace"), processes=processes, code=code)
            if node_count(args) > 1:
                reason += f" (on the worker's node; the other nodes' output: {NODE_LOG_NAME.format(node='*')})"
        # A no-op when rank 0 ended the job (finished, cancelled, stopped, or failed with its own error).
        error = f"{reason} (log: {log_path})"[:2000]
        job_end_logged(job.pk, worker, status=WorkStatus.FAILED, error=error, message=f"failed: {reason}")
    row = TrainingJob.objects.filter(pk=job.pk).values("status", "worker").first()
    if row is None or row["worker"] != worker:
        return "skipped"
    return row["status"]


def _leftovers_stop(job_id: int, tag: str) -> None:
    """Once torchrun has ended: kill what its processes left running (`launch.tagged_stop`),
    and say so in the job's log."""
    stopped = tagged_stop(tag)
    if stopped:
        message = f"stopped {len(stopped)} process(es) the training processes left running (pids {stopped})"
        log.warning("training job %s: %s", job_id, message)
        with contextlib.suppress(DatabaseError):
            step = TrainingJob.objects.filter(pk=job_id).values_list("step", flat=True).first() or 0
            job_event_add(job_id, JobEventKind.LOG, step, {"message": message})


def _supervise(launched: subprocess.Popen, poll_seconds: float, *, stop) -> int | None:
    """Wait for `launched` (torchrun); every `poll_seconds`, ask `stop()`. Returns its exit
    code, or None when `stop()` said yes and it was stopped (`process_stop`). Anything
    raised while waiting (a database error in `stop`, an interrupt) stops it too: the
    caller would otherwise leave a training group running behind it."""
    try:
        while True:
            try:
                return launched.wait(timeout=poll_seconds)
            except subprocess.TimeoutExpired:
                pass
            if stop():
                code = launched.poll()  # it may have exited by itself meanwhile
                if code is not None:
                    return code
                process_stop(launched)
                return None
    except BaseException:
        if launched.poll() is None:
            process_stop(launched)
        raise


def process_stop(launched: subprocess.Popen, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM to torchrun, which stops its processes (they also get SIGKILL when it dies);
    SIGKILL if it has not exited after `grace` seconds."""
    launched.terminate()
    try:
        launched.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        launched.kill()
        launched.wait()


def _formed(joined: Path, worker: str) -> bool:
    """Whether this worker's group has formed: rank 0 of *its* torchrun wrote the mark
    (a late rank 0 of an earlier attempt on the same run folder writes another name)."""
    try:
        return joined.read_text() == worker
    except OSError:
        return False


def _unformed_stop(job_id: int, worker: str) -> bool:
    """Stop a group that has not formed: its job was cancelled (the loop that reads the flag
    is not running yet), or this worker no longer holds it. Only for several nodes: on one
    node the group forms within seconds of the launch."""
    if node_count(settings.TRAINING_TORCHRUN_ARGS) < 2:
        return False
    try:
        row = TrainingJob.objects.filter(pk=job_id).values("cancel_requested", "worker", "status").first()
    except DatabaseError:  # no answer is no reason to stop; the next poll connects again
        connection.close()
        return False
    if row is None:
        return True
    held = row["worker"] == worker and row["status"] in (WorkStatus.RUNNING, WorkStatus.CANCELLING)
    return row["cancel_requested"] or not held


def group_joined_mark(job: TrainingJob, worker: str, processes: int) -> None:
    """Rank 0, once the group has formed: the mark the worker's supervisor reads (`JOINED_NAME`,
    holding the worker's name) and a line on the job's page, while `worker` holds the job."""
    if not TrainingJob.objects.filter(pk=job.pk, worker=worker).exists():
        return
    (job_run_dir(job) / JOINED_NAME).write_text(worker)
    joined = f"all {processes} training processes joined" if processes > 1 else "the training process started"
    job_event_add(job.pk, JobEventKind.LOG, job.step, {"message": joined})


_SUMMARY = re.compile(r"^(?:Failures|Root Cause \(first observed failure\)):\s*$", re.M)
_ENTRY = re.compile(r"^\[\d+\]:\s*$(?P<body>.*?)(?=^\[\d+\]:\s*$|^-{10,}|^={10,}|\Z)", re.S | re.M)
_FIELD = re.compile(r"^\s*(?P<name>rank|exitcode|traceback)\s*:\s*(?P<value>.*)$", re.M)
# What the processes that did not cause a failure die of: a collective that broke under
# them, or torchrun's SIGTERM once another process failed.
_CONSEQUENCES = ("GroupBroken", "SIGTERM")


def processes_failure(log_text: str, *, processes: int, code: int) -> str:
    """What broke a job's process group, from torchrun's summary of the last launch: which
    rank, its exit code, and its error (a signal, or the last line of what it raised). The
    process that failed first is named, not one that only saw it (a broken collective, or
    torchrun's SIGTERM), whichever torchrun happened to observe first."""
    starts = [m.start() for m in _SUMMARY.finditer(log_text)]  # "Failures:", then "Root Cause"
    summary = log_text[starts[-2 if len(starts) > 1 else -1] :] if starts else ""
    entries = [e for e in (_failure_entry(m["body"]) for m in _ENTRY.finditer(summary)) if e["rank"] != "?"]
    if not entries:
        tail = " ".join(log_text.strip().splitlines()[-3:])[-500:]
        what = f"the {processes} training processes" if processes > 1 else "the training process"
        return f"{what} failed (torchrun exit code {code}): {tail or 'no output'}"
    causes = [e for e in entries if not any(word in e["cause"] for word in _CONSEQUENCES)]
    root = entries[-1]  # the summary's "Root Cause" comes last
    chosen = root if root in causes or not causes else causes[0]
    rank, exitcode, cause = chosen["rank"], chosen["exitcode"], chosen["cause"]
    which = f"training process rank {rank} of {processes}" if processes > 1 else "the training process"
    return f"{which} failed (exit code {exitcode}): {cause}"[:1500]


def _failure_entry(body: str) -> dict[str, str]:
    fields = {m["name"]: m["value"].strip() for m in _FIELD.finditer(body)}
    cause = fields.get("traceback", "")
    if cause.startswith("Traceback") or not cause:
        lines = [ln.strip() for ln in body.splitlines() if ln.strip()]
        cause = lines[-1] if lines else ""  # an exception's last line says what it was
    return {
        "rank": fields.get("rank", "?").split(" ")[0],
        "exitcode": re.sub(r"\s*\(pid: \d+\)", "", fields.get("exitcode", "?")),
        "cause": cause,
    }


def training_job_node_run(
    *, job_id: int, node_rank: int, wait_seconds: float = 600.0, poll_seconds: float = 1.0
) -> int:
    """Node `node_rank` (1 or more) of a job over several nodes: once the worker that holds the
    job is running it, the same torchrun it started (`TRAINING_TORCHRUN_ARGS`) as that node,
    whose processes train their shards and write nothing to the job; the worker's node is
    node 0. Returns torchrun's exit code; raises `NodeError` when this node cannot join.

    One `train_node` per node of a job (`node_claim`): a second one is refused at once. While
    its torchrun runs it watches the job: if another worker takes the job over (it resumed
    elsewhere, with a rendezvous this torchrun is not part of) or the job ends and torchrun
    does not exit by itself, it stops torchrun and raises `NodeError` saying why."""
    node_launch_check(settings.TRAINING_TORCHRUN_ARGS, node_rank)
    if not (math.isfinite(wait_seconds) and wait_seconds >= 0):
        raise NodeError("the wait must be a number of seconds, 0 or more")
    with node_claim(job_id, node_rank) as claim:
        return _node_run(job_id, node_rank, wait_seconds, poll_seconds, claim)


class NodeClaim:
    """Node `node_rank` of job `job_id`, held by this process: a session advisory lock of
    PostgreSQL, so a `train_node` that dies (killed, its machine gone) lets go with its
    connection. On SQLite, which has one machine, there is no claim. The lock lives on the
    process's own database session: behind a transaction-mode pooler (pgbouncer) a node
    must reach PostgreSQL directly."""

    def __init__(self, job_id: int, node_rank: int):
        digest = hashlib.sha256(f"practicum-train-node:{job_id}:{node_rank}".encode()).digest()
        self.key = int.from_bytes(digest[:8], "big", signed=True)

    def take(self) -> bool:
        """Take the node; False when another process holds it. Once per database session
        (PostgreSQL counts a session's repeated takes)."""
        if connection.vendor != "postgresql":
            return True
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s)", [self.key])
            return bool(cursor.fetchone()[0])

    def release(self) -> None:
        if connection.vendor != "postgresql":
            return
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [self.key])
        except DatabaseError:  # the session is gone, and its lock with it
            pass


@contextlib.contextmanager
def node_claim(job_id: int, node_rank: int):
    """Hold node `node_rank` of job `job_id` (`NodeClaim`) for the block, or raise
    `NodeError` at once when another process holds it."""
    claim = NodeClaim(job_id, node_rank)
    if not claim.take():
        raise NodeError(
            f"node {node_rank} of training job {job_id} is already joined by another train_node; stop it first"
        )
    try:
        yield claim
    finally:
        claim.release()


def _node_run(job_id: int, node_rank: int, wait_seconds: float, poll_seconds: float, claim: NodeClaim) -> int:
    deadline = time.monotonic() + wait_seconds
    while True:
        job = TrainingJob.objects.filter(pk=job_id).first()
        if job is None:
            raise NodeError(f"training job {job_id} does not exist")
        try:
            config = config_from_dict(job.config)
        except (ConfigError, TypeError, KeyError) as exc:  # a row written past the create service
            raise NodeError(f"training job {job_id}'s config cannot be read: {exc}") from None
        if config.processes < 2:
            raise NodeError(f"training job {job_id} runs in one process (its config's processes is {config.processes})")
        problem = group_size_problem(settings.TRAINING_TORCHRUN_ARGS, config.processes, config.prompts_per_step)
        if problem is not None:
            raise NodeError(f"training job {job_id}: {problem}")
        if job.status == WorkStatus.RUNNING and job.worker:
            break
        if job.status not in (WorkStatus.QUEUED, WorkStatus.RUNNING):
            raise NodeError(f"training job {job_id} is {job.status}: there is nothing to join")
        if time.monotonic() > deadline:
            raise NodeError(f"training job {job_id} was not started by a worker within {wait_seconds:.0f} s")
        time.sleep(poll_seconds)
    log.info("joining training job %s held by %s as node %s", job_id, job.worker, node_rank)
    command = torchrun_command(job_id=job_id, worker=job.worker, processes=config.processes)
    at = command.index("--nproc-per-node")  # torchrun reads the last --node-rank given
    command[at:at] = ["--node-rank", str(node_rank)]
    run_dir = job_run_dir(job)
    run_dir.mkdir(parents=True, exist_ok=True)
    held_by = job.worker
    why: list[str] = []
    seen: dict[str, float | bool] = {"session_lost": False}

    def leave() -> bool:
        """Whether this node's torchrun must stop (the reason in `why`). A database error
        is no reason: the next poll connects again and takes the claim again."""
        try:
            if seen["session_lost"]:
                if not claim.take():
                    why.append(f"another train_node joined node {node_rank} while this one's database session was down")
                    return True
                seen["session_lost"] = False
            row = TrainingJob.objects.filter(pk=job_id).values("status", "worker").first()
        except DatabaseError:
            connection.close()
            seen["session_lost"] = True
            return False
        if row is None:
            why.append(f"training job {job_id} was deleted")
        elif row["worker"] != held_by:
            why.append(f"training job {job_id} is now held by {row['worker'] or 'no worker'}, not {held_by}")
        elif row["status"] not in (WorkStatus.RUNNING, WorkStatus.CANCELLING):
            # torchrun exits by itself once the job's processes end; it gets the grace,
            # timed on this node's clock from when the end was first seen.
            ended = seen.setdefault("ended", time.monotonic())
            if time.monotonic() - ended > STOP_GRACE_SECONDS:
                why.append(f"training job {job_id} ended ({row['status']}) and this node's processes did not")
        return bool(why)

    # In the shared run folder, beside the worker's processes.log: a failure that began on
    # this node shows on the worker's only as a broken group.
    tag = launch_tag(job_id)
    try:
        with open(run_dir / NODE_LOG_NAME.format(node=node_rank), "ab") as out:
            launched = subprocess.Popen(
                command,
                cwd=ROOT,
                env=os.environ | {LAUNCH_TAG: tag},
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=parent_death_signal_setter(signal.SIGTERM),
            )
            code = _supervise(launched, poll_seconds, stop=leave)
    finally:
        _leftovers_stop(job_id, tag)
    if code is None:
        raise NodeError(f"{why[0]}: this node's training processes were stopped")
    return code


def training_job_rank_run(*, job_id: int, worker: str) -> str:
    """One process of a data-parallel job, in the group torchrun set up. Rank 0 trains and
    ends the job as `worker` (which holds it); the others train their shards. Returns the
    job's status on rank 0, "trained" elsewhere."""
    import torch
    from torch.distributed import DistError

    from training.trainer.parallel import GroupBroken, process_group_close, process_group_init

    job = TrainingJob.objects.select_related("base_version__base_model", "deployment").get(pk=job_id)
    config = config_from_dict(job.config)
    cuda = config.device != "cpu" and torch.cuda.is_available()
    ranks = process_group_init(cuda=cuda, timeout_seconds=settings.TRAINING_COLLECTIVE_TIMEOUT_SECONDS)
    status = WorkStatus.FAILED
    try:
        if ranks.owner:
            group_joined_mark(job, worker, ranks.size)
            # A broken group (a peer died) is the supervisor's to report: it knows which.
            status = training_job_held_run(job, worker, leave=(GroupBroken, DistError))
        else:
            job_train(job, worker, owner=False)
            status = "trained"
        return status
    finally:
        # Together only when this process got to the loop's end, as the others then do.
        process_group_close(
            together=status in ("trained", WorkStatus.FINISHED, WorkStatus.CANCELLED, WorkStatus.STOPPED)
        )
