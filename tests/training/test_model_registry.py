"""Base models, versions and the live pointer (no inference server needed)."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction

from tests.factories import DeploymentFactory, UserFactory
from training.serving.models import LiveVersion, LiveVersionChange, ModelVersion, ModelVersionStatus
from training.serving.services import ModelRegistryError, base_model_register, live_version_set, model_version_create


@pytest.fixture
def hf_folder(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    return tmp_path / "base"


@pytest.fixture
def adapter_folder(tmp_path):
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "adapter_config.json").write_text(json.dumps({"r": 8}))
    return tmp_path / "lora"


def test_base_model_registration_is_idempotent_and_makes_a_base_version(db, hf_folder):
    base, version = base_model_register(name="smol", path=hf_folder)
    again, same = base_model_register(name="smol", path=hf_folder)
    assert (again.pk, same.pk) == (base.pk, version.pk)
    assert (version.kind, version.name, version.path) == ("base", "smol", str(hf_folder.resolve()))
    with pytest.raises(ModelRegistryError, match=r"config\.json"):
        base_model_register(name="empty", path=hf_folder.parent)


def test_live_pointer_flips_in_one_row_with_an_audit_trail(db, hf_folder, adapter_folder):
    deployment, user = DeploymentFactory(), UserFactory()
    base, base_version = base_model_register(name="smol", path=hf_folder)
    v1 = model_version_create(name="smol-v1", base_model=base, kind="lora", path=adapter_folder, parent=base_version)
    live_version_set(deployment=deployment, version=base_version)
    live_version_set(deployment=deployment, version=v1, user=user, reason="promoted")
    live_version_set(deployment=deployment, version=v1, user=user)  # already live: no-op

    assert LiveVersion.objects.get(deployment=deployment).version == v1
    changes = list(LiveVersionChange.objects.filter(deployment=deployment).order_by("id"))
    assert [(c.from_version, c.to_version) for c in changes] == [(None, base_version), (base_version, v1)]
    assert changes[1].changed_by == user and changes[1].reason == "promoted"
    v1.refresh_from_db()
    base_version.refresh_from_db()
    assert (v1.status, base_version.status) == (ModelVersionStatus.LIVE, ModelVersionStatus.APPROVED)
    assert v1.parent == base_version

    # The database itself refuses a second live row for the deployment.
    with pytest.raises(IntegrityError), transaction.atomic():
        LiveVersion.objects.create(deployment=deployment, version=base_version)


def test_versions_are_checked_before_they_are_registered(db, hf_folder, adapter_folder):
    base, _ = base_model_register(name="smol", path=hf_folder)
    with pytest.raises(ModelRegistryError, match=r"adapter_config\.json"):
        model_version_create(name="x", base_model=base, kind="lora", path=hf_folder)
    with pytest.raises(ModelRegistryError, match="letters, digits"):
        model_version_create(name="bad name", base_model=base, kind="lora", path=adapter_folder)
    failed = model_version_create(name="f", base_model=base, kind="lora", path=adapter_folder)
    ModelVersion.objects.filter(pk=failed.pk).update(status=ModelVersionStatus.FAILED)
    failed.refresh_from_db()
    with pytest.raises(ModelRegistryError, match="failed"):
        live_version_set(deployment=DeploymentFactory(), version=failed)


def test_commands_register_a_folder_and_make_it_live(db, hf_folder, adapter_folder):
    call_command("prepare_model", "local", "--path", str(hf_folder), "--name", "gpu-model", "--live-for", "bot")
    assert LiveVersion.objects.get(deployment__name="bot").version.name == "gpu-model"
    call_command("register_version", "gpu-model-v2", "--base", "gpu-model", "--path", str(adapter_folder))
    call_command("set_live", "bot", "gpu-model-v2", "--no-load")
    assert LiveVersion.objects.get(deployment__name="bot").version.name == "gpu-model-v2"


def test_serve_inference_builds_the_vllm_command(db, hf_folder, capsys):
    base_model_register(name="smol", path=hf_folder)
    call_command("serve_inference", "--print-command", "--port", "8123")
    command = capsys.readouterr().out
    assert "-m vllm.entrypoints.openai.api_server" in command
    for flag in (
        "--enable-lora",
        "--host 127.0.0.1",
        "--port 8123",
        "--served-model-name smol",
        "--tool-call-parser hermes",
        "--logprobs-mode processed_logprobs",  # what the trainer's sampling correction divides by
    ):
        assert flag in command
