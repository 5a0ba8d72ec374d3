"""Versions, deployments, evaluations and people for the promotion tests.

`registry` builds a deployment serving a base version, with a LoRA candidate built from it,
on folders that only look like models (nothing is served): enough for every rule that
does not need an inference server. The vLLM tests build theirs on the real tiny model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from django.utils import timezone

from tests.factories import DeploymentFactory, user_with_role
from training.inference.server import free_port


@dataclass
class Registry:
    deployment: object
    base: object
    base_version: object
    candidate: object


def make_adapter_folder(path, *, poison: bool = False):
    """A folder shaped like a peft LoRA adapter (config and safetensors weights); `poison`
    puts NaN in its B matrix, as a diverged run would."""
    import numpy as np
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    b = np.zeros((16, 8), dtype=np.float32)
    if poison:
        b[3, 2] = np.nan
    save_file(
        {
            "base_model.model.layers.0.self_attn.q_proj.lora_A.weight": np.ones((8, 16), dtype=np.float32),
            "base_model.model.layers.0.self_attn.q_proj.lora_B.weight": b,
        },
        str(path / "adapter_model.safetensors"),
    )
    return path


@pytest.fixture
def registry(db, tmp_path) -> Registry:
    from training.serving.services import base_model_register, live_version_set, model_version_create

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    # Nothing listens on this port: any call to "the server" fails to connect.
    base, base_version = base_model_register(
        name="smol", path=tmp_path / "base", inference_url=f"http://127.0.0.1:{free_port()}"
    )
    deployment = DeploymentFactory(name="support-bot")
    live_version_set(deployment=deployment, version=base_version)
    candidate = model_version_create(
        name="smol-v1", base_model=base, kind="lora", path=make_adapter_folder(tmp_path / "v1"), parent=base_version
    )
    return Registry(deployment=deployment, base=base, base_version=base_version, candidate=candidate)


def evaluation_row(candidate, deployment, baseline, *, status="finished", done=None, total=4):
    """An evaluation in a given state, stored directly (the run itself is tested elsewhere)."""
    from training.promotion.models import Evaluation

    return Evaluation.objects.create(
        deployment=deployment,
        candidate=candidate,
        baseline=baseline,
        status=status,
        total=total,
        done=total if done is None else done,
        finished_at=timezone.now() if status == "finished" else None,
        summary={"comparison": {"win_rate": 0.75, "n": total}} if status == "finished" else {},
    )


@pytest.fixture
def operator(db):
    return user_with_role("operator", "olga")


@pytest.fixture
def approver(db):
    return user_with_role("approver", "arno")


@pytest.fixture
def second_approver(db):
    return user_with_role("approver", "bea")


@pytest.fixture
def approving_operator(db):
    """Someone who both requests and may approve: the four-eyes rule still applies."""
    user = user_with_role("operator", "omar")
    from django.contrib.auth.models import Group

    user.groups.add(Group.objects.get(name="approver"))
    return user


def live_moves(deployment) -> list[tuple]:
    """The deployment's trail of live moves, oldest first: (from, to, how, who, why, the
    request's id, the release's id), the versions and the person by name."""
    from training.serving.models import LiveVersionChange

    rows = LiveVersionChange.objects.filter(deployment=deployment).select_related(
        "from_version", "to_version", "changed_by"
    )
    return [
        (
            c.from_version.name if c.from_version else None,
            c.to_version.name,
            c.kind,
            c.changed_by.username if c.changed_by else None,
            c.reason,
            c.promotion_id,
            c.release_id,
        )
        for c in rows.order_by("id")
    ]
