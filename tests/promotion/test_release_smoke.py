"""The release's smoke request against a scripted inference server that speaks vLLM's wire
protocol (tests/fixtures/chat_upstream.py): an answer with no text — empty, or whitespace
only, cut off at the token limit or not — fails the release with the reason in its error
and its audit record, and the live version stays; an answer cut off after some text passes
(the smoke request is bounded to a few tokens on purpose)."""

from __future__ import annotations

import pytest

import training.promotion.services.release as release_service
from tests.fixtures.chat_upstream import ChatUpstream
from tests.promotion.conftest import evaluation_row, make_adapter_folder
from training.promotion.models import AuditAction, AuditEvent, PromotionStatus
from training.promotion.services.promotion import promotion_approve, promotion_request_create
from training.promotion.services.release import release_run
from training.serving.models import LiveVersion
from webapp.kernel.work import WorkStatus


@pytest.fixture
def scripted(db, tmp_path, monkeypatch):
    """A deployment whose base model is served by a scripted server; the candidate is a LoRA
    over it whose load is taken as done (the scripted server has no adapters to load)."""
    from tests.factories import DeploymentFactory
    from training.serving.services import base_model_register, live_version_set, model_version_create

    answer: dict = {"content": "Hello!"}
    upstream = ChatUpstream(reply=lambda body: {**answer, "model": body["model"]})
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    base, base_version = base_model_register(name="smol", path=tmp_path / "base", inference_url=upstream.url)
    deployment = DeploymentFactory(name="support-bot")
    live_version_set(deployment=deployment, version=base_version)
    candidate = model_version_create(
        name="smol-v1", base_model=base, kind="lora", path=make_adapter_folder(tmp_path / "v1"), parent=base_version
    )
    monkeypatch.setattr(release_service, "release_load", lambda version: {"loaded": "lora", "name": version.name})
    monkeypatch.setattr(release_service, "release_adapter_unload", lambda version_id: [])
    yield deployment, base_version, candidate, upstream, answer
    upstream.close()


def released(deployment, base_version, candidate, operator, approver):
    evaluation = evaluation_row(candidate, deployment, base_version)
    promotion = promotion_request_create(
        candidate=candidate, deployment=deployment, evaluation=evaluation, requested_by=operator
    )
    release = promotion_approve(promotion=promotion, user=approver)
    return promotion, release_run(release_id=release.pk, worker="deploy-test")


@pytest.mark.parametrize(
    ("content", "finish_reason", "why"),
    [
        ("", "length", "answered with an empty answer and was cut off at the token limit (finish_reason 'length'"),
        (" \n\t ", "length", "answered with only whitespace (' \\n\\t ') and was cut off at the token limit"),
        ("", "stop", "answered with an empty answer (finish_reason 'stop'"),
    ],
)
def test_a_smoke_answer_without_text_fails_the_release_and_the_old_version_stays(
    scripted, operator, approver, content, finish_reason, why
):
    deployment, base_version, candidate, upstream, answer = scripted
    answer.update(content=content, finish_reason=finish_reason)

    promotion, release = released(deployment, base_version, candidate, operator, approver)

    assert upstream.requests[-1]["model"] == candidate.name  # the smoke request reached the server
    assert release.status == WorkStatus.FAILED
    assert release.error.startswith("smoke request " + why), release.error
    assert LiveVersion.objects.get(deployment=deployment).version == base_version
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.FAILED
    failed = AuditEvent.objects.get(action=AuditAction.RELEASE_FAILED)
    assert failed.detail == release.error and failed.to_version == candidate
    assert not AuditEvent.objects.filter(action=AuditAction.RELEASE_SMOKE_PASSED).exists()


def test_a_smoke_answer_cut_off_after_some_text_passes(scripted, operator, approver):
    deployment, base_version, candidate, _, answer = scripted
    answer.update(content="Hello! How can I", finish_reason="length")

    _, release = released(deployment, base_version, candidate, operator, approver)

    assert release.status == WorkStatus.FINISHED, release.error
    assert release.smoke["content"] == "Hello! How can I" and release.smoke["finish_reason"] == "length"
    assert LiveVersion.objects.get(deployment=deployment).version == candidate
