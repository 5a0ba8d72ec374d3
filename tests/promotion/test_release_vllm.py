"""Releases against the real vLLM server on the tiny model (in-process, no worker): the
adapter is loaded, smoke-tested and made live; a corrupt one fails its smoke test and
the old version stays live; rollback goes back. The version the rollback returns to is the
talking adapter: the random tiny model itself answers only newlines, which no smoke test
passes."""

from __future__ import annotations

import math

import pytest

from tests.fixtures.inference import talking_version_create
from tests.promotion.conftest import evaluation_row
from training.promotion.models import AuditAction, AuditEvent, PromotionStatus
from training.promotion.services.promotion import promotion_approve, promotion_request_create
from training.promotion.services.release import release_run
from training.promotion.services.rollback import rollback_request
from training.serving.models import LiveVersion, LiveVersionChange, ModelVersion
from training.serving.services import model_version_create
from webapp.kernel.work import WorkStatus

pytestmark = [pytest.mark.vllm, pytest.mark.postgres]


@pytest.fixture
def corrupt_adapter_path(tool_call_adapter_path, tmp_path):
    """The tool-call adapter with NaN in every LoRA B matrix: it loads, then answers garbage."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    dest = tmp_path / "corrupt"
    shutil.copytree(tool_call_adapter_path, dest)
    weights = load_file(dest / "adapter_model.safetensors")
    poisoned = {k: torch.full_like(v, float("nan")) if "lora_B" in k else v for k, v in weights.items()}
    save_file(poisoned, dest / "adapter_model.safetensors")
    return dest


@pytest.fixture
def live_base(tiny_base):
    from tests.factories import DeploymentFactory
    from training.serving.services import live_version_set

    deployment = DeploymentFactory(name="support-bot")
    base_version = ModelVersion.objects.get(name=tiny_base.name)
    live_version_set(deployment=deployment, version=base_version)
    return deployment, base_version


def candidate_version(name, path, tiny_base):
    from training.serving.services import model_version_create

    return model_version_create(
        name=name, base_model=tiny_base, kind="lora", path=path, parent=ModelVersion.objects.get(name=tiny_base.name)
    )


def approved_release(deployment, candidate, baseline, operator, approver):
    evaluation = evaluation_row(candidate, deployment, baseline)
    promotion = promotion_request_create(
        candidate=candidate, deployment=deployment, evaluation=evaluation, requested_by=operator
    )
    return promotion, promotion_approve(promotion=promotion, user=approver, comment="ship it")


def test_release_serves_the_adapter_then_rollback_restores_the_version_before(
    vllm_server, tiny_base, tool_call_adapter_path, talking_adapter_path, live_base, operator, approver
):
    from training.serving.services import live_version_set

    deployment, _ = live_base
    base_version = talking_version_create(tiny_base, talking_adapter_path, vllm_server)
    live_version_set(deployment=deployment, version=base_version)
    candidate = model_version_create(
        name="tiny-tools-r1", base_model=tiny_base, kind="lora", path=tool_call_adapter_path, parent=base_version
    )
    promotion, release = approved_release(deployment, candidate, base_version, operator, approver)

    release = release_run(release_id=release.pk)

    assert release.status == WorkStatus.FINISHED, release.error
    assert LiveVersion.objects.get(deployment=deployment).version == candidate
    assert candidate.name in {m.id for m in vllm_server.client().models()}
    assert release.smoke["model"] == candidate.name and release.smoke["tokens"] > 0
    assert release.timings["picked_up_ms"] <= release.timings["loaded_ms"] <= release.timings["live_ms"]
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.DEPLOYED

    back = release_run(release_id=rollback_request(deployment=deployment, user=approver, reason="test").pk)

    assert back.status == WorkStatus.FINISHED, back.error
    assert back.smoke["content"].startswith("Hello!")
    assert LiveVersion.objects.get(deployment=deployment).version == base_version
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.ROLLED_BACK
    # The rolled-back adapter stays loaded: requests that started on it finish on it.
    assert candidate.name in {m.id for m in vllm_server.client().models()}
    assert list(AuditEvent.objects.order_by("id").values_list("action", "from_version", "to_version")) == [
        (AuditAction.PROMOTION_REQUESTED, base_version.pk, candidate.pk),
        (AuditAction.PROMOTION_APPROVED, base_version.pk, candidate.pk),
        (AuditAction.RELEASE_LOADED, base_version.pk, candidate.pk),
        (AuditAction.RELEASE_SMOKE_PASSED, base_version.pk, candidate.pk),
        (AuditAction.ROLLBACK_REQUESTED, candidate.pk, base_version.pk),
        (AuditAction.RELEASE_LOADED, candidate.pk, base_version.pk),
        (AuditAction.RELEASE_SMOKE_PASSED, candidate.pk, base_version.pk),
    ]
    moves = LiveVersionChange.objects.filter(deployment=deployment).order_by("id")
    assert list(moves.values_list("from_version", "to_version", "kind"))[-2:] == [
        (base_version.pk, candidate.pk, "promotion"),
        (candidate.pk, base_version.pk, "rollback"),
    ]


def test_a_failed_smoke_request_leaves_the_old_version_live(
    vllm_server, tiny_base, tool_call_adapter_path, live_base, operator, approver, settings
):
    deployment, base_version = live_base
    candidate = candidate_version("tiny-refused", tool_call_adapter_path, tiny_base)
    promotion, release = approved_release(deployment, candidate, base_version, operator, approver)
    # The server refuses the smoke request itself (400). A tiny timeout was not a reliable way
    # to fail it: on a quiet machine the tiny model sometimes answered in time.
    settings.RELEASE_SMOKE_MAX_TOKENS = -1

    release = release_run(release_id=release.pk)

    assert release.status == WorkStatus.FAILED
    assert release.error.startswith("smoke request failed:"), release.error
    assert LiveVersion.objects.get(deployment=deployment).version == base_version
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.FAILED
    # The adapter that failed is unloaded again; the live version still answers.
    assert candidate.name not in {m.id for m in vllm_server.client().models()}
    assert vllm_server.client().chat(model=base_version.name, messages=[{"role": "user", "content": "hi"}])
    actions = list(AuditEvent.objects.order_by("id").values_list("action", flat=True))
    assert actions[-2:] == [AuditAction.RELEASE_LOADED, AuditAction.RELEASE_FAILED]


def test_a_corrupt_adapter_never_reaches_the_server(
    vllm_server, tiny_base, corrupt_adapter_path, live_base, operator, approver
):
    """A NaN adapter would break every completion of this server, the live version's too,
    until restarted: the release refuses it before loading."""
    deployment, base_version = live_base
    candidate = candidate_version("tiny-corrupt", corrupt_adapter_path, tiny_base)
    _, release = approved_release(deployment, candidate, base_version, operator, approver)

    release = release_run(release_id=release.pk)

    assert release.status == WorkStatus.FAILED
    assert "tiny-corrupt was not loaded" in release.error and "NaN" in release.error
    assert candidate.name not in {m.id for m in vllm_server.client().models()}
    answer = vllm_server.client().chat(model=base_version.name, messages=[{"role": "user", "content": "hi"}])
    assert all(math.isfinite(lp) for lp in answer.token_logprobs)


def test_prompt_logprobs_score_another_versions_tokens(vllm_server, tiny_base, tool_call_adapter_path):
    """The log-probs the client reads back for a completion's tokens are the ones the
    completion reported; under another version they differ (what the KL is made of)."""
    candidate = candidate_version("tiny-tools-lp", tool_call_adapter_path, tiny_base)
    vllm_server.client().adapter_load(candidate.name, candidate.path)
    server = vllm_server.client()
    result = server.chat(
        model=candidate.name, messages=[{"role": "user", "content": "Where is my order A1001?"}], max_tokens=12
    )
    prompt = result.raw["prompt_token_ids"]
    same = server.prompt_logprobs(model=candidate.name, token_ids=prompt + result.token_ids, start=len(prompt))
    other = server.prompt_logprobs(model=tiny_base.name, token_ids=prompt + result.token_ids, start=len(prompt))
    assert len(same) == len(other) == len(result.token_ids) == 12
    assert all(math.isclose(a, b, abs_tol=1e-3) for a, b in zip(same, result.token_logprobs, strict=True))
    # The adapter is near-certain of its tool call; the random base model is not.
    assert sum(same) > sum(other) + 5
