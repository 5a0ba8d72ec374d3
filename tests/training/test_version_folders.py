"""A registered version's folder is never deleted or written into: a finished job's weights
go to a new folder of their own and a name of their own, however long the chain of jobs
that led to it, and rebuilding or re-registering a model cannot repoint what is served."""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command

from training.models import TrainingJob
from training.services.job_runner import _finish
from training.serving.models import BaseModel, ModelVersion, ModelVersionKind
from training.serving.services import (
    ModelRegistryError,
    base_model_register,
    deployment_get_or_create,
    live_version_set,
)
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db


def adapter(folder: Path, weights: bytes) -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4}')
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_long_chain_of_jobs_never_touches_the_live_adapter(settings, tmp_path):
    settings.MODELS_DIR = tmp_path / "models"
    base = BaseModel.objects.create(name="smol", path=str(tmp_path / "base"))
    deployment = deployment_get_or_create(name="support-bot")
    # A version whose name is at the 120-character limit, in the folder named after it (as
    # jobs used to place their weights): the live adapter.
    name = ("smol-" + "-".join(["sft-job1"] * 20))[:120].rstrip("-")
    live_folder = adapter(settings.MODELS_DIR / "versions" / name, b"live weights")
    live = ModelVersion.objects.create(name=name, base_model=base, kind=ModelVersionKind.LORA, path=str(live_folder))
    live_version_set(deployment=deployment, version=live)
    before = digest(live_folder)

    parent = live
    for generation in range(3):
        job = TrainingJob.objects.create(
            kind="sft",
            config={"adapter": "lora"},
            base_version=parent,
            deployment=deployment,
            worker="w",
            status=WorkStatus.RUNNING,  # held by worker "w", as `_finish` requires
        )
        export = adapter(tmp_path / "runs" / f"job-{job.pk}" / "model", f"unevaluated {generation}".encode())
        status = _finish(job.pk, "w", SimpleNamespace(status="finished", export_path=export, step=1, breaches=[]))
        assert status == WorkStatus.FINISHED
        job.refresh_from_db()
        child = job.result_version
        assert child.name != parent.name and len(child.name) <= 120 and f"job{job.pk}" in child.name
        assert Path(child.path) not in (Path(parent.path), Path(live.path))
        assert (Path(child.path) / "adapter_model.safetensors").read_bytes() == f"unevaluated {generation}".encode()
        parent = child

    assert digest(live_folder) == before
    live.refresh_from_db()
    assert Path(live.path) == live_folder and deployment.live.version_id == live.pk


def test_prepare_model_never_rebuilds_a_registered_folder(settings, tmp_path):
    folder = tmp_path / "registered"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    base_model_register(name="served", path=folder)
    with pytest.raises(CommandError, match="nothing writes into a registered folder"):
        call_command("prepare_model", "tiny", "--path", str(folder), "--name", "other", "--force")
    assert [p.name for p in folder.iterdir()] == ["config.json"]


def test_registering_a_base_model_again_cannot_repoint_its_weights_or_server(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for folder in (first, second):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    base, _ = base_model_register(name="served", path=first, inference_url="http://127.0.0.1:8001")
    with pytest.raises(ModelRegistryError, match="register other weights"):
        base_model_register(name="served", path=second)
    with pytest.raises(ModelRegistryError):
        base_model_register(name="served", path=first, inference_url="http://elsewhere:8001")
    base.refresh_from_db()
    assert (base.path, base.inference_url) == (str(first.resolve()), "http://127.0.0.1:8001")
    # The same registration again is fine (make demo does it on every start).
    assert base_model_register(name="served", path=first)[0].inference_url == "http://127.0.0.1:8001"
