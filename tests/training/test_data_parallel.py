"""Data-parallel jobs ("processes": N): torchrun's gloo processes on the CPU train the
same adapter as one process on the same global batches; a dead process fails the job
with its reason, and a cancel stops every process (docs/decisions/0026)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from tests.fixtures.configs import small
from tests.fixtures.worker import _database_url, process_group_stop, wait_for
from tests.training.test_jobs_worker import _job, _start_worker
from training.inference.server import free_port
from training.models import JobEventKind, TrainingJob
from training.services.job_processes import processes_failure
from training.services.job_runner import job_run_dir
from training.services.job_start import training_job_run
from training.services.jobs import training_job_cancel, training_job_create
from webapp.kernel.work import WorkStatus, work_worker_name

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    "steps": 3,
    "prompts_per_step": 4,
    "group_size": 4,
    "max_new_tokens": 6,
    "eval_every": 0,
    "checkpoint_every": 2,
    "samples_every": 1,
    "learning_rate": 5e-3,
}


def test_an_items_samples_do_not_depend_on_the_items_beside_it(tiny_model_dir):
    """The property the equality rests on: item k of a global batch draws from its own
    stream, so it gets the same tokens in a shard of one process as in the whole batch."""
    import torch

    from training.trainer.config import GRPOConfig
    from training.trainer.parallel import Ranks, item_generators
    from training.trainer.policy import load_policy
    from training.trainer.sampling import encode_prompt, sample

    policy = load_policy(small(GRPOConfig, tiny_model_dir))
    prompts = [encode_prompt(policy.tokenizer, [{"role": "user", "content": f"Order A{k}, please."}]) for k in range(4)]

    def drawn(ranks: Ranks, mine: list[list[int]]) -> torch.Tensor:
        generators = item_generators(ranks, seed=3, step=2, count=len(mine))
        rollout = sample(policy.model, policy.tokenizer, mine, num_samples=3, max_new_tokens=8, generators=generators)
        return rollout.response_ids

    whole = drawn(Ranks(), prompts)
    second = drawn(Ranks(rank=1, size=2), Ranks(rank=1, size=2).shard(prompts))  # items 1 and 3
    width = second.shape[1]
    assert torch.equal(second, torch.cat([whole[3:6], whole[9:12]])[:, :width])
    assert not torch.equal(whole[0:3], whole[3:6])  # and the items' streams differ


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("kind", "config", "reason"),
    [
        ("grpo", {"processes": 0}, "between 1 and 64"),
        ("grpo", {"processes": 65}, "between 1 and 64"),
        ("sft", {"processes": "2"}, "must be int"),
        ("grpo", {"processes": 3, "prompts_per_step": 2}, "≤ prompts_per_step"),
        ("episodes", {"processes": 2}, "run in one process"),
        ("grpo", {"sharding": "fsdp"}, "needs processes ≥ 2"),
        ("sft", {"sharding": "zero3", "processes": 2}, "'replicate' or 'fsdp'"),
        ("sft", {"sharding": "fsdp", "processes": 2, "adapter": "full"}, "LoRA jobs"),
    ],
)
def test_a_bad_processes_setting_is_a_400_naming_the_field(client, base_version, task_set, kind, config, reason):
    from tests.factories import user_with_role

    client.force_login(user_with_role("operator"))
    body = {"kind": kind, "base_version": "tiny-base", "training_set": task_set.pk, "config": config}

    answer = client.post("/api/v1/jobs", body, content_type="application/json")

    assert answer.status_code == 400, answer.content
    error = answer.json()["errors"][0]
    field = "config.sharding" if "sharding" in config else "config.processes"
    assert error["field"] == field and reason in error["reason"], error


@pytest.mark.parametrize("kind", ["grpo", "sft", "distill"])
def test_lora_dropout_is_refused_with_more_than_one_process(kind):
    """Every process seeds torch's global stream alike, so each would draw the same dropout
    masks for its own rows: the job would not train as one process does."""
    from training.trainer.config import ConfigError, config_from_dict

    config_from_dict({"kind": kind, "processes": 1, "lora_dropout": 0.1})
    config_from_dict({"kind": kind, "processes": 2, "lora_dropout": 0.0})
    with pytest.raises(ConfigError) as err:
        config_from_dict({"kind": kind, "processes": 2, "lora_dropout": 0.1})
    assert [field for field, _ in err.value.errors] == ["lora_dropout"]


@pytest.mark.django_db
@pytest.mark.parametrize("processes", [100_000, "2", 2.5])
def test_a_processes_setting_written_past_the_create_service_never_reaches_torchrun(
    base_version, task_set, monkeypatch, processes
):
    """The worker validates the stored config before it launches anything: a `processes`
    out of range or of the wrong type fails the job with the config's error, and torchrun
    is never started (it would start that many processes)."""
    from training.models import TrainingJob
    from training.services import job_processes

    launched = []
    monkeypatch.setattr(job_processes.subprocess, "call", lambda command, **_: launched.append(command) or 1)
    job = training_job_create(
        kind="grpo", config=CONFIG, base_version=base_version, training_set=task_set, enqueue=False
    )
    TrainingJob.objects.filter(pk=job.pk).update(config=job.config | {"processes": processes})

    assert training_job_run(job_id=job.pk, worker=work_worker_name("test")) == WorkStatus.FAILED
    assert launched == []
    assert "processes" in _job(job.pk).error


def test_torchruns_summary_names_the_process_that_broke_the_group():
    summary = """
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
manage.py FAILED
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-03_14:58:01
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 11923)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 11923
============================================================
"""
    assert processes_failure(summary, processes=2, code=1) == (
        "training process rank 1 of 2 failed (exit code -9  (SIGKILL)): Signal 9 (SIGKILL) received by PID 11923"
    )
    raised = """
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 1077)
  error_file: /tmp/torchelastic_7xwqhtm7/attempt_0/1/error.json
  traceback : Traceback (most recent call last):
    File "/work/training/services/job_processes.py", line 7, in training_job_rank_run
      raise ValueError("the judge could not be reached")
  ValueError: the judge could not be reached

============================================================
"""
    assert processes_failure(raised, processes=2, code=1) == (
        "training process rank 1 of 2 failed (exit code 1): ValueError: the judge could not be reached"
    )
    # Rank 0 saw the broken collective at the same second torchrun saw rank 1 die: rank 1 is named.
    raced = """
Failures:
[1]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 2201)  (SIGKILL)
  traceback : Signal 9 (SIGKILL) received by PID 2201
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 2200)
  traceback : Traceback (most recent call last):
    File "training/trainer/parallel.py", line 31, in _collective
  training.trainer.parallel.GroupBroken: GroupBroken: RuntimeError: Connection reset by peer
============================================================
"""
    assert processes_failure(raced, processes=2, code=1).startswith("training process rank 1 of 2 failed (exit code -9")
    assert "no output" in processes_failure("", processes=2, code=1)


def _adapter(version):
    from safetensors.torch import load_file

    return load_file(str(Path(version.path) / "adapter_model.safetensors"))


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "kind", ["sft", "grpo", "grpo-sparse", "distill", "sft-fsdp", "grpo-sparse-fsdp", "distill-fsdp"]
)
def test_two_processes_train_the_adapter_one_process_trains(kind, base_version, process_env):
    """The same job, one process against two gloo processes, through the worker's service
    (job rows in PostgreSQL, torchrun, `manage.py train_rank`): the same adapter after 3
    steps, the same losses and rewards, and one owner's events. "grpo-sparse": only 2 of
    10 items can ever be rewarded, so in some steps one process keeps no group and joins
    the update with a zero gradient. "-fsdp": the two processes split the model's weights
    (`sharding: fsdp`), evaluate at step 2 and 3 and checkpoint at step 2 in lockstep; the
    one-process job evaluates alike, and the evaluations agree."""
    import torch

    from training.services.training_sets import training_set_from_tasks

    sharded = kind.endswith("-fsdp")
    kind = kind.removesuffix("-fsdp")
    sparse = kind == "grpo-sparse"
    kind = kind.removesuffix("-sparse")
    tasks = [
        {
            "prompt": f"Say something about order A{i}.",
            "reference": "zzqqxxjj" if sparse and i >= 2 else "e",  # never in 6 tokens: equal rewards
            "grader": "contains",
            "target": f"A{i} e.",
            "feedback": "Name the order first.",
        }
        for i in range(10)
    ]
    # Sharded SFT and distillation evaluate held-out items (GRPO: canaries, below).
    heldout = 0.3 if sharded and not sparse else 0.0
    training_set = training_set_from_tasks(name="orders", tasks=tasks, heldout_fraction=heldout)
    config = CONFIG if kind == "grpo" else {k: v for k, v in CONFIG.items() if k != "group_size"}
    if kind == "distill":
        config = config | {"samples_per_prompt": 3}
    if sharded and sparse:  # evaluations: canaries, sampled by both processes in lockstep
        canaries = [
            {"prompt": f"Say something about order B{i}.", "reference": "e", "grader": "contains"} for i in range(3)
        ]
        config = config | {"canaries": canaries}
    if sharded:
        config = config | {"eval_every": 2}
    jobs = {}
    for processes in (1, 2):
        job = training_job_create(
            kind=kind,
            config=config | {"processes": processes} | ({"sharding": "fsdp"} if sharded and processes > 1 else {}),
            base_version=base_version,
            training_set=training_set,
            enqueue=False,
        )
        status = training_job_run(job_id=job.pk, worker=work_worker_name("test"))
        assert status == WorkStatus.FINISHED, _job(job.pk).error
        jobs[processes] = _job(job.pk)

    one, two = _adapter(jobs[1].result_version), _adapter(jobs[2].result_version)
    assert one.keys() == two.keys() and one
    for name in one:
        assert torch.allclose(one[name], two[name], atol=1e-5, rtol=0), name
    assert any(float(one[n].abs().max()) > 0 for n in one if "lora_B" in n)  # it trained: B starts at zero

    def history(job, key):  # None where the step did not measure it (a step's event leaves it out)
        return [e.data.get(key) for e in job.events.filter(kind=JobEventKind.STEP).order_by("step")]

    figures = ["loss", "grad_norm", "response_length"]
    figures += ["reward_mean", "reward_std", "kl", "generated_tokens", "trained_sequences"] if kind == "grpo" else []
    figures += ["teacher_kl", "generated_tokens", "empty_share", "truncated_share"] if kind == "distill" else []
    for key in figures:
        assert history(jobs[2], key) == pytest.approx(history(jobs[1], key), abs=1e-5), key
    if kind == "grpo":  # β = 0: the reference's pass at the steps that evaluate and the last, in step on both
        measured = [kl is not None for kl in history(jobs[2], "kl")]
        assert measured == ([False, True, True] if sharded else [False, False, True])
    if sharded:  # every process sampled the evaluations; rank 0 scored them as one process does
        key = "canary_reward" if sparse else "reward"
        evals = {
            p: [(e.step, e.data) for e in jobs[p].events.filter(kind=JobEventKind.EVAL).order_by("step")] for p in jobs
        }
        assert [s for s, _ in evals[2]] == [0, 2, 3] and len(evals[2]) == len(evals[1])
        for (_, one_eval), (_, two_eval) in zip(evals[1], evals[2], strict=True):
            assert two_eval[key] == pytest.approx(one_eval[key], abs=1e-6)
    if sparse:  # one group kept of the batch's four: the other process had none
        assert any(0 < rows <= CONFIG["group_size"] for rows in history(jobs[1], "trained_sequences"))
    assert history(jobs[2], "step") == [1, 2, 3] and jobs[2].checkpoint_step == 2
    logs = [e.data["message"] for e in jobs[2].events.filter(kind=JobEventKind.LOG)]
    assert "starting 2 training processes (torchrun)" in logs and "checkpoint at step 2" in logs
    if kind == "grpo":  # the sample rows are rank 0's share of the batch: 2 items of 4, 4 samples each
        assert len(jobs[2].events.get(kind=JobEventKind.SAMPLE, step=1).data["rows"]) == 8


def _rank_pids(job_id: int) -> dict[int, int]:
    """The live `train_rank` processes of a job, by rank (from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"train_rank" not in argv or str(job_id).encode() not in argv:
                continue
            if (entry / "stat").read_text().split(") ")[-1].startswith("Z"):
                continue  # a zombie: already dead, not yet reaped
            environ = dict(
                item.split(b"=", 1) for item in (entry / "environ").read_bytes().split(b"\0") if b"=" in item
            )
        except OSError:
            continue
        if b"RANK" in environ:  # torchrun's own process has the same arguments and no rank
            found[int(environ[b"RANK"])] = int(entry.name)
    return found


@pytest.mark.redis
@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_worker_cancels_every_process_and_fails_a_job_whose_process_died(base_version, task_set, tmp_path):
    """A real Celery worker runs two-process jobs: a cancel stops both processes with a
    checkpoint; a process killed mid-job fails the job, saying which and why, in seconds."""
    subprocess.run(
        [sys.executable, "-m", "celery", "-A", "webapp", "purge", "-f", "-Q", "training,default"],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        env=os.environ | {"DATABASE_URL": _database_url()},
    )
    config = CONFIG | {"processes": 2, "steps": 500, "samples_every": 0, "checkpoint_every": 50}
    worker = _start_worker(tmp_path, "parallel")
    try:
        job = training_job_create(kind="grpo", config=config, base_version=base_version, training_set=task_set)
        wait_for(lambda: _job(job.pk).step >= 2, 240, "two steps of the two-process job", tmp_path)
        assert set(_rank_pids(job.pk)) == {0, 1}
        training_job_cancel(job=_job(job.pk))
        wait_for(lambda: _job(job.pk).status == WorkStatus.CANCELLED, 60, "the cancel", tmp_path)
        cancelled = _job(job.pk)
        assert cancelled.checkpoint_step == cancelled.step < 500 and cancelled.result_version is None
        wait_for(lambda: not _rank_pids(job.pk), 30, "both processes to exit", tmp_path)

        doomed = training_job_create(kind="grpo", config=config, base_version=base_version, training_set=task_set)
        wait_for(lambda: _job(doomed.pk).step >= 2, 240, "two steps of the second job", tmp_path)
        os.kill(_rank_pids(doomed.pk)[1], signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: _job(doomed.pk).status == WorkStatus.FAILED, 60, "the job to fail", tmp_path)
        failed_after = time.monotonic() - killed
        wait_for(lambda: not _rank_pids(doomed.pk), 30, "rank 0 to exit", tmp_path)
    finally:
        process_group_stop(worker)
    failed = _job(doomed.pk)
    assert "training process rank 1 of 2 failed" in failed.error and "SIGKILL" in failed.error, failed.error
    assert failed_after < 60 and failed.step < 500
    logs = [e.data["message"] for e in failed.events.filter(kind=JobEventKind.LOG)]
    assert any(m.startswith("failed: training process rank 1 of 2") for m in logs)


_RANK = """
import os, signal, sys, time
sys.path.insert(0, {root!r})
from training.trainer.launch import parent_death_signal
parent_death_signal(signal.SIGKILL)
open(os.path.join({folder!r}, "rank-" + os.environ["RANK"]), "w").write(str(os.getpid()))
time.sleep(120)
"""
_SUPERVISOR = """
import signal, subprocess, sys
sys.path.insert(0, {root!r})
from training.trainer.launch import parent_death_signal_setter
command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", {rank!r}]
process = subprocess.Popen(command, preexec_fn=parent_death_signal_setter(signal.SIGTERM))
print(process.pid, flush=True)
process.wait()
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[-1]
    except OSError:
        return False
    return not state.startswith("Z")


def _ranks_started(folder: Path) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        files = sorted(folder.glob("rank-*"))
        if len(files) == 2 and all(f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.2)
    raise AssertionError("the two processes did not start")


def _gone(pids: list[int], seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(_alive(pid) for pid in pids):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("killed", ["worker", "torchrun"])
def test_a_jobs_processes_do_not_outlive_the_worker_or_torchrun(tmp_path, killed):
    """The worker killed outright (SIGKILL, the OOM killer, a revoke with terminate) takes
    torchrun and every rank with it; torchrun killed outright takes its ranks (they run in
    sessions of their own), so no orphan trains on beside the worker's next job."""
    rank = tmp_path / "rank.py"
    rank.write_text(_RANK.format(root=str(ROOT), folder=str(tmp_path)))
    supervisor = subprocess.Popen(
        [sys.executable, "-c", _SUPERVISOR.format(root=str(ROOT), rank=str(rank))],
        stdout=subprocess.PIPE,
        text=True,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    torchrun = int(supervisor.stdout.readline())
    ranks = _ranks_started(tmp_path)
    try:
        time.sleep(2)
        assert all(_alive(pid) for pid in [*ranks, torchrun]), "a process died while its launcher lived"
        os.kill(supervisor.pid if killed == "worker" else torchrun, signal.SIGKILL)
        supervisor.wait(timeout=30) if killed == "worker" else None
        assert _gone(ranks + ([torchrun] if killed == "worker" else [])), "a process outlived its launcher"
    finally:
        for pid in [*ranks, torchrun, supervisor.pid]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        supervisor.wait(timeout=30)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_job_over_two_nodes_trains_the_adapter_one_process_trains(base_version, process_env, settings, monkeypatch):
    """Two nodes on loopback: the worker's node runs torchrun as node 0 of a static
    rendezvous, the other joins with `manage.py train_node --node-rank 1` (started first:
    with a dynamic rendezvous it would take rank 0); 2 processes on each train the adapter
    one process trains on the same global batches, and the worker's node owns the job."""
    import threading

    import torch

    from training.services.training_sets import training_set_from_tasks

    rendezvous = f"--nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port {free_port()}"
    tasks = [{"prompt": f"Where is order A{i}?", "target": f"A{i} shipped.", "grader": "contains"} for i in range(8)]
    training_set = training_set_from_tasks(name="orders", tasks=tasks, heldout_fraction=0.0)
    config = {k: v for k, v in CONFIG.items() if k != "group_size"}
    one = training_job_create(
        kind="sft", config=config, base_version=base_version, training_set=training_set, enqueue=False
    )
    assert training_job_run(job_id=one.pk, worker=work_worker_name("test")) == WorkStatus.FINISHED

    settings.TRAINING_TORCHRUN_ARGS = rendezvous  # the worker's node
    monkeypatch.setenv("PRACTICUM_TRAINING_TORCHRUN_ARGS", rendezvous)  # the other node's command reads it
    job = training_job_create(
        kind="sft",
        config=config | {"processes": 2},
        base_version=base_version,
        training_set=training_set,
        enqueue=False,
    )
    node = _train_node(job.pk, wait=120)
    ended, head = {}, work_worker_name("head")
    worker = threading.Thread(target=lambda: ended.update(status=training_job_run(job_id=job.pk, worker=head)))
    worker.start()
    try:
        worker.join(timeout=300)
        output = node.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        process_group_stop(node)
    assert ended.get("status") == WorkStatus.FINISHED, output[-3000:]
    assert node.returncode == 0, output[-3000:]

    two = _job(job.pk)
    assert two.worker == head and two.config["processes"] == 2
    first, second = _adapter(_job(one.pk).result_version), _adapter(two.result_version)
    assert first.keys() == second.keys() and first
    # A sum over 4 processes rounds differently from one process's: Adam's g/√v turns the
    # last bits of a near-zero gradient into up to ~3e-5 of weight after 3 steps.
    for name in first:
        assert torch.allclose(first[name], second[name], atol=1e-4, rtol=0), name
    assert any(float(first[n].abs().max()) > 1e-3 for n in first if "lora_B" in n)  # it trained: B starts at zero


@pytest.mark.django_db
def test_a_node_has_nothing_to_join_without_a_rendezvous_or_a_running_job(base_version, task_set, settings):
    from training.services.job_processes import NodeError, training_job_node_run

    job = training_job_create(
        kind="grpo", config={"processes": 2}, base_version=base_version, training_set=task_set, enqueue=False
    )

    def join(args: str, node_rank: int = 1, job_id: int = job.pk):
        settings.TRAINING_TORCHRUN_ARGS = args
        return training_job_node_run(job_id=job_id, node_rank=node_rank, wait_seconds=0, poll_seconds=0)

    static = "--nnodes 2 --node-rank 0 --master-addr head --master-port 29400"
    with pytest.raises(NodeError, match="names no other node"):
        join("--standalone")
    # A dynamic rendezvous ranks nodes as they join: this node could take rank 0, the owner's.
    with pytest.raises(NodeError, match="c10d rendezvous gives rank 0"):
        join("--nnodes 2 --rdzv-backend c10d --rdzv-endpoint head:29400 --rdzv-id job-{job}")
    for rank in (0, 2):
        with pytest.raises(NodeError, match="--node-rank must be from 1 to 1"):
            join(static, node_rank=rank)
    with pytest.raises(NodeError, match="not started by a worker within 0 s"):
        join(static)
    with pytest.raises(NodeError, match="0 or more"):
        training_job_node_run(job_id=job.pk, node_rank=1, wait_seconds=float("nan"))
    # 2 nodes of 2 processes and 4 prompts a step fit; 3 nodes do not: a process would get none.
    with pytest.raises(NodeError, match="group has 6 processes"):
        join("--nnodes 3 --node-rank 0 --master-addr head --master-port 29400")
    with pytest.raises(NodeError, match="does not exist"):
        join(static, job_id=job.pk + 1000)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_worker_fails_a_job_whose_group_is_larger_than_its_batch(base_version, task_set, process_env, settings):
    settings.TRAINING_TORCHRUN_ARGS = "--nnodes 3 --node-rank 0 --master-addr 127.0.0.1 --master-port 29400"
    job = training_job_create(
        kind="grpo", config=CONFIG | {"processes": 2}, base_version=base_version, training_set=task_set, enqueue=False
    )

    assert training_job_run(job_id=job.pk, worker=work_worker_name("test")) == WorkStatus.FAILED
    assert "group has 6 processes (3 nodes of 2)" in _job(job.pk).error


# The session holding a node's claim (the test's own connection holds none).
def _holders_query(job_id: int, node_rank: int) -> tuple[str, list[int]]:
    """The session holding this node's claim. Other advisory locks (another test's worker,
    a job left from an earlier test) must not count: taking any of them for the node's own
    lock let the test race the node to its claim, and win it, under load."""
    from training.services.job_processes import NodeClaim

    key = NodeClaim(job_id, node_rank).key & 0xFFFFFFFFFFFFFFFF  # PostgreSQL splits it in two oids
    return (
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
        "AND classid = %s AND objid = %s AND pid <> pg_backend_pid()",
        [key >> 32, key & 0xFFFFFFFF],
    )


def _train_node(job_id: int, *, wait: float = 0) -> subprocess.Popen:
    """`manage.py train_node` for node 1 of the job, in a session of its own."""
    command = [sys.executable, str(ROOT / "manage.py"), "train_node", "--job", str(job_id), "--node-rank", "1"]
    return subprocess.Popen(
        [*command, "--wait", str(wait)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_node_joins_once_and_leaves_when_its_job_moves_to_another_worker(
    base_version, task_set, process_env, settings, monkeypatch
):
    """A second `train_node` for a node already joined is refused at once (it used to wait
    forever at the rendezvous); the first, left over once another worker has taken the job
    (resumed elsewhere, with a rendezvous it is not part of), stops its torchrun and says why."""
    from training.services.job_processes import NodeError, training_job_node_run

    rendezvous = f"--nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port {free_port()}"
    settings.TRAINING_TORCHRUN_ARGS = rendezvous
    monkeypatch.setenv("PRACTICUM_TRAINING_TORCHRUN_ARGS", rendezvous)
    job = training_job_create(
        kind="grpo", config={"processes": 2}, base_version=base_version, training_set=task_set, enqueue=False
    )
    TrainingJob.objects.filter(pk=job.pk).update(status=WorkStatus.RUNNING, worker="head-1")  # no node 0 comes
    first = _train_node(job.pk)
    holders = _holders_query(job.pk, 1)
    try:
        run_dir = job_run_dir(_job(job.pk))
        wait_for(lambda: (run_dir / "processes-node1.log").exists(), 60, "the first node's torchrun", run_dir)
        with pytest.raises(NodeError, match="already joined by another train_node"):
            training_job_node_run(job_id=job.pk, node_rank=1, wait_seconds=0)

        # Its database session dies (a failover): it stays, and takes its node again.
        with connection.cursor() as cursor:
            cursor.execute(*holders)
            (holder,) = cursor.fetchone()
            cursor.execute("SELECT pg_terminate_backend(%s)", [holder])

        def retaken():
            with connection.cursor() as cursor:
                cursor.execute(*holders)
                row = cursor.fetchone()
            return row is not None and row[0] != holder

        wait_for(retaken, 30, "the node to take its claim again", run_dir)
        assert first.poll() is None
        with pytest.raises(NodeError, match="already joined by another train_node"):
            training_job_node_run(job_id=job.pk, node_rank=1, wait_seconds=0)

        TrainingJob.objects.filter(pk=job.pk).update(worker="head-2")  # the job resumed elsewhere
        output = first.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        process_group_stop(first)
    assert first.returncode != 0
    assert "is now held by head-2, not head-1: this node's training processes were stopped" in output, output[-2000:]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_cancel_before_every_node_joined_stops_the_workers_processes(base_version, task_set, process_env, settings):
    """Rank 0 reads the cancel flag between steps, which never come while node 1 is missing:
    the worker stops its torchrun itself and ends the job cancelled."""
    import threading

    settings.TRAINING_TORCHRUN_ARGS = f"--nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port {free_port()}"
    job = training_job_create(
        kind="grpo", config=CONFIG | {"processes": 2}, base_version=base_version, training_set=task_set, enqueue=False
    )
    ended: dict = {}

    def run() -> None:
        try:
            ended.update(status=training_job_run(job_id=job.pk, worker=work_worker_name("head")))
        finally:
            connection.close()  # the thread's own session: the test database is dropped after

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:
        started = _job(job.pk).events.filter(data__message="starting 2 training processes (torchrun)").exists
        wait_for(started, 60, "the worker's torchrun", job_run_dir(_job(job.pk)))
        time.sleep(2)  # torchrun is waiting at the rendezvous for node 1
        training_job_cancel(job=_job(job.pk))
        worker.join(timeout=90)
    finally:
        worker.join(timeout=60)
    assert ended.get("status") == WorkStatus.CANCELLED
    row = _job(job.pk)
    assert row.status == WorkStatus.CANCELLED
    logs = [e.data["message"] for e in row.events.filter(kind=JobEventKind.LOG)]
    assert "cancelled before every node joined: the training processes were stopped" in logs
    assert "all 2 training processes joined" not in logs


def test_a_supervisor_that_fails_while_waiting_stops_what_it_launched():
    """A database error while the worker or a node watches its torchrun must not leave the
    training group running behind it."""
    from django.db import OperationalError

    from training.services.job_processes import _supervise

    launched = subprocess.Popen(["sleep", "300"])

    def stop() -> bool:
        raise OperationalError("the connection is closed")

    with pytest.raises(OperationalError):
        _supervise(launched, 0.05, stop=stop)
    assert launched.poll() is not None
