"""Whoever can write a job's run folder must not run code on the workers: checkpoints load
tensors and plain containers only, and the `latest` pointer may name only a `step-N` folder
inside the run's own `checkpoints/`, never through a symlink or `..`."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from training.trainer.config import GRPOConfig
from training.trainer.policy import (
    CheckpointRefused,
    Policy,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)


class Payload:
    """Unpickling this opens (creates) a file: the proof that a pickle ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def small_policy() -> tuple[Policy, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    policy = Policy(model=model, tokenizer=None, device=torch.device("cpu"), adapter="full")
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()  # the optimizer now holds state (moments, step counts)
    return policy, optimizer


def checkpoint(run_dir: Path) -> Path:
    policy, optimizer = small_policy()
    return save_checkpoint(
        run_dir, policy=policy, optimizer=optimizer, step=3, config=GRPOConfig(model_path="m"), state={"k": 1}
    )


def test_a_checkpoint_round_trips_with_tensors_only(tmp_path):
    path = checkpoint(tmp_path)
    assert latest_checkpoint(tmp_path) == path
    policy, optimizer = small_policy()
    expected = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}
    with torch.no_grad():
        policy.model.weight.zero_()
    fresh = torch.optim.AdamW(policy.model.parameters(), lr=0.1)
    saved = load_checkpoint(path, policy=policy, optimizer=fresh)
    assert saved["step"] == 3 and saved["state"] == {"k": 1}
    assert policy.model.weight.abs().sum() > 0
    for key, value in expected.items():
        assert torch.equal(fresh.state_dict()["state"][0][key], value)


@pytest.mark.parametrize("file", ["rng.pt", "optimizer.pt"])
def test_a_pickled_object_in_a_checkpoint_is_refused_and_never_run(tmp_path, file):
    path = checkpoint(tmp_path / "run")
    marker = tmp_path / "code-ran"
    if file == "rng.pt":
        torch.save({"torch": torch.get_rng_state(), "python": Payload(marker)}, path / file)
    else:
        torch.save({"state": {}, "param_groups": [Payload(marker)]}, path / file)
    policy, optimizer = small_policy()
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(path, policy=policy, optimizer=optimizer)
    assert not marker.exists()


def test_latest_may_not_point_outside_the_runs_checkpoints(tmp_path):
    elsewhere = checkpoint(tmp_path / "other-job")  # a real checkpoint, of another run
    run = tmp_path / "job"
    checkpoint(run)
    pointer = run / "checkpoints" / "latest"
    for name in (f"../../other-job/checkpoints/{elsewhere.name}", str(elsewhere), "step-000003/..", ".step-000003"):
        pointer.write_text(name)
        with pytest.raises(CheckpointRefused):
            latest_checkpoint(run)


def test_latest_may_not_go_through_a_symlink(tmp_path):
    elsewhere = checkpoint(tmp_path / "other-job")
    run = tmp_path / "job"
    mine = checkpoint(run)
    root = run / "checkpoints"

    # The step folder itself a link to another run's checkpoint.
    os.rename(mine, tmp_path / "moved")
    os.symlink(elsewhere, mine)
    with pytest.raises(CheckpointRefused, match="not a folder inside"):
        latest_checkpoint(run)
    os.unlink(mine)
    os.rename(tmp_path / "moved", mine)
    assert latest_checkpoint(run) == mine

    # A file of the checkpoint a link.
    os.rename(mine / "optimizer.pt", tmp_path / "optimizer.pt")
    os.symlink(elsewhere / "optimizer.pt", mine / "optimizer.pt")
    with pytest.raises(CheckpointRefused, match="symlink"):
        latest_checkpoint(run)
    os.unlink(mine / "optimizer.pt")
    os.rename(tmp_path / "optimizer.pt", mine / "optimizer.pt")

    # The pointer a link.
    (root / "latest").unlink()
    os.symlink(elsewhere.parent / "latest", root / "latest")
    with pytest.raises(CheckpointRefused, match="symlink"):
        latest_checkpoint(run)


def test_a_run_without_a_pointer_starts_from_scratch(tmp_path):
    assert latest_checkpoint(tmp_path) is None
