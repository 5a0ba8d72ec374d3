"""Sharded jobs (`"sharding": "fsdp"`, FSDP2 over torchrun's gloo processes on the CPU):
the same adapter as one process, every lockstep path taken, and a cancelled job resumed
from its checkpoint as if it had never stopped (docs/decisions/0032-fsdp2-lockstep.md)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("fsdp_job.py")


def _job(model: Path, run_dir: Path, *args: str, processes: int = 2) -> dict:
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    command = [*(launch if processes > 1 else [sys.executable]), str(SCRIPT), str(model), str(run_dir), *args]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _adapter(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "model" / "adapter_model.safetensors"))


@pytest.mark.slow
def test_a_sharded_job_trains_what_one_process_trains_and_resumes_where_it_stopped(tiny_model_dir, tmp_path):
    import torch

    one = _job(tiny_model_dir, tmp_path / "one", processes=1)
    whole = _job(tiny_model_dir, tmp_path / "fsdp", "--sharding", "fsdp")
    # Cancelled before the first step (a checkpoint with no optimizer state yet), resumed and
    # cancelled before step 3, resumed again.
    before = _job(tiny_model_dir, tmp_path / "resumed", "--sharding", "fsdp", "--cancel-at", "1")
    stopped = _job(tiny_model_dir, tmp_path / "resumed", "--sharding", "fsdp", "--cancel-at", "3")
    resumed = _job(tiny_model_dir, tmp_path / "resumed", "--sharding", "fsdp")

    assert one["status"] == whole["status"] == resumed["status"] == "finished"
    assert before == before | {"status": "cancelled", "step": 0}
    assert stopped == stopped | {"status": "cancelled", "step": 2} and "resumed from step-000000" in stopped["logs"]
    assert "resumed from step-000002" in resumed["logs"]
    # Each process held about half the weights: they were split, not copied.
    split = next(line for line in whole["logs"] if line.startswith("fsdp:"))
    total, held = (int(n.replace(",", "")) for n in re.findall(r"([0-9][0-9,]*) (?:weights|here)", split))
    assert 0.4 * total < held < 0.6 * total, split
    # Only item 0 carried signal: its process trained alone while the other padded its passes.
    assert whole["trained_sequences"] == one["trained_sequences"] and max(one["trained_sequences"]) <= 4
    assert any(one["trained_sequences"])

    reference = _adapter(tmp_path / "one")
    assert any(float(v.abs().max()) > 0 for n, v in reference.items() if "lora_B" in n)  # it trained
    for run in ("fsdp", "resumed"):
        adapter = _adapter(tmp_path / run)
        assert adapter.keys() == reference.keys()
        for name, value in reference.items():
            assert adapter[name].shape == value.shape, name  # whole tensors, not a process's shard
            assert torch.allclose(adapter[name], value, atol=1e-5, rtol=0), (run, name)


def test_a_process_that_left_the_group_runs_none_of_its_threads(tiny_model_dir, tmp_path):
    """Leaving the group joins gloo's threads, even after loading a model imported torch's
    FSDP modules (which evaluate the group into function defaults): threads that outlive
    the group run on into the interpreter's exit."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command += [str(SCRIPT.with_name("group_close_job.py")), str(tiny_model_dir), str(tmp_path)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=os.environ | {"OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    processes = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("*.json"))]
    assert sorted(p["rank"] for p in processes) == [0, 1]
    for process in processes:
        assert not [t for t in process["threads"] if "gloo" in t], process


def test_a_sharded_job_refuses_an_adapter_outside_the_blocks(tiny_model_dir):
    """An adapter on the output layer would sit in the root unit, which FSDP2 keeps gathered
    after a forward pass: refused with the layer's name before any collective."""
    from training.trainer.config import SFTConfig
    from training.trainer.parallel import Ranks
    from training.trainer.policy import load_policy
    from training.trainer.sharding import shard_model

    policy = load_policy(SFTConfig(model_path=str(tiny_model_dir), lora_target=".*(q_proj|lm_head)"))
    with pytest.raises(ValueError, match=r"outside: .*lm_head"):
        shard_model(policy.model, Ranks(rank=0, size=2))


def test_only_a_failed_communication_is_a_broken_group():
    """A gather that fails for want of memory or from a bug fails the job with its own error;
    only the backend's failure is `GroupBroken` (which the worker reads as another process's
    doing)."""
    import torch

    from training.trainer.parallel import GroupBroken, gathering

    def raising(exc):
        def fn():
            raise exc

        return fn

    with pytest.raises(GroupBroken, match="Connection reset"):
        gathering(raising(RuntimeError("Connection reset by peer")))
    with pytest.raises(KeyError):
        gathering(raising(KeyError(4)))
    with pytest.raises(torch.OutOfMemoryError):
        gathering(raising(torch.OutOfMemoryError("CUDA out of memory")))


def test_a_skeleton_has_the_loaded_models_parameters_and_buffers_without_their_memory(tiny_model_dir):
    """A sharded job's other processes build the model this way, and rank 0's weights fill
    it: the same parameters (names, shapes, which train, the tied output layer), the same
    buffers and end-of-turn ids, and no memory for the weights."""
    import torch

    from training.trainer.config import SFTConfig
    from training.trainer.policy import load_policy
    from training.trainer.sampling import eos_ids

    config = SFTConfig(model_path=str(tiny_model_dir))
    loaded, empty = load_policy(config), load_policy(config, weights="none")

    def layout(model):
        return [(n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in model.named_parameters()]

    assert layout(empty.model) == layout(loaded.model)
    assert all(p.is_meta for p in empty.model.parameters())
    buffers = dict(loaded.model.named_buffers())
    assert buffers and {n: b.is_meta for n, b in empty.model.named_buffers()} == dict.fromkeys(buffers, False)
    for name, buffer in empty.model.named_buffers():
        assert torch.equal(buffer, buffers[name]), name
    assert eos_ids(empty.model, empty.tokenizer) == eos_ids(loaded.model, loaded.tokenizer)
