"""The tiny model, built once and shared with the inference tests, and one torch thread for every test."""

from __future__ import annotations

import pytest

from tests.training.policies import world  # noqa: F401 - the learning policy tests' deployment


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_path):
    """The tiny model the inference server serves (tests/fixtures/inference.py): one build a
    session, not two (the tests only read the folder)."""
    import torch

    torch.set_num_threads(1)
    return tiny_model_path


@pytest.fixture
def process_env(monkeypatch, settings, tmp_path):
    """What torchrun's processes (a data-parallel job's) need to reach this test's database
    and folders."""
    from tests.fixtures.worker import _database_url

    monkeypatch.setenv("DATABASE_URL", _database_url())
    monkeypatch.setenv("PRACTICUM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PRACTICUM_TRAINING_DIR", str(settings.TRAINING_DIR))
    monkeypatch.setenv("PRACTICUM_MODELS_DIR", str(settings.MODELS_DIR))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


_TASKS = [{"prompt": f"Say something about order A{i}.", "reference": "e", "grader": "contains"} for i in range(12)]


@pytest.fixture
def base_version(tiny_model_dir, settings, tmp_path):
    """The tiny model registered as a live base version, with run folders under tmp_path."""
    from training.serving.models import BaseModel, ModelVersion, ModelVersionKind

    settings.TRAINING_DIR = tmp_path / "training"
    settings.MODELS_DIR = tmp_path / "models"
    base = BaseModel.objects.create(name="tiny", path=str(tiny_model_dir))
    return ModelVersion.objects.create(
        name="tiny-base", base_model=base, kind=ModelVersionKind.BASE, path=str(tiny_model_dir), status="live"
    )


@pytest.fixture
def task_set():
    """Twelve graded prompts, a quarter held out."""
    from training.services.training_sets import training_set_from_tasks

    return training_set_from_tasks(name="orders", tasks=_TASKS, heldout_fraction=0.25)
