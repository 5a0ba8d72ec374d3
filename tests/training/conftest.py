"""The tiny model, built once per test session, and one torch thread for every test."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    import torch

    from training.modelprep import tiny_prepare

    torch.set_num_threads(1)
    return tiny_prepare(tmp_path_factory.mktemp("models") / "tiny")
