"""Every route to the live pointer leaves the audit row a release leaves when it switches
(`live_switched`, from and to): the commands as much as a promotion's release."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from training.promotion.models import AuditAction, AuditEvent
from training.serving.models import LiveVersion, ModelVersion, ModelVersionStatus
from training.serving.services import base_model_register, model_version_create


@pytest.fixture
def base_folder(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text("{}")
    return tmp_path / "base"


@pytest.fixture
def adapter_folder(tmp_path):
    (tmp_path / "lora").mkdir()
    (tmp_path / "lora" / "adapter_config.json").write_text(json.dumps({"r": 8}))
    return tmp_path / "lora"


def _switches(deployment: str) -> list[tuple[str | None, str, str]]:
    rows = AuditEvent.objects.filter(action=AuditAction.LIVE_SWITCHED, deployment__name=deployment).order_by("id")
    return [
        (e.from_version.name if e.from_version else None, e.to_version.name, e.detail)
        for e in rows.select_related("from_version", "to_version")
    ]


def test_prepare_model_and_set_live_each_leave_a_live_switched_row(db, base_folder, adapter_folder):
    call_command("prepare_model", "local", "--path", str(base_folder), "--name", "m", "--live-for", "bot")
    call_command("register_version", "m-v2", "--base", "m", "--path", str(adapter_folder))
    call_command("set_live", "bot", "m-v2", "--no-load", "--reason", "hotfix")
    assert _switches("bot") == [(None, "m", "prepare_model --live-for"), ("m", "m-v2", "hotfix")]
    # Already live: the pointer does not move, and nothing is recorded.
    call_command("set_live", "bot", "m-v2", "--no-load")
    assert len(_switches("bot")) == 2


def test_a_refused_switch_records_nothing(db, base_folder, adapter_folder):
    call_command("prepare_model", "local", "--path", str(base_folder), "--name", "m", "--live-for", "bot")
    base = ModelVersion.objects.get(name="m")
    failed = model_version_create(name="m-bad", base_model=base.base_model, path=adapter_folder, kind="lora")
    ModelVersion.objects.filter(pk=failed.pk).update(status=ModelVersionStatus.FAILED)
    with pytest.raises(CommandError, match="failed"):
        call_command("set_live", "bot", "m-bad", "--no-load")
    assert LiveVersion.objects.get(deployment__name="bot").version.name == "m"
    assert _switches("bot") == [(None, "m", "prepare_model --live-for")]


def test_demo_setup_serving_a_base_leaves_a_live_switched_row(db, base_folder):
    base_model_register(name="tiny", path=base_folder)
    call_command("demo_setup", "--serve-base", "tiny")
    assert _switches("support-bot") == [(None, "tiny", "make demo")]
    call_command("demo_setup", "--serve-base", "tiny")  # a restart: already served, nothing new
    assert len(_switches("support-bot")) == 1


def test_every_route_to_live_in_the_product_and_its_scripts_writes_the_audit_row():
    """Only the release, a progressive release completing and the hand route (which all write
    `live_switched`) call the pointer's low-level setter; a new caller must go through one."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    callers = {
        path.relative_to(root).as_posix()
        for folder in ("feedback", "training", "webapp", "scripts")
        for path in (root / folder).rglob("*.py")
        if "migrations" not in path.parts and re.search(r"\blive_version_set\(", path.read_text())
    }
    assert callers == {
        "training/serving/services.py",  # where it is defined
        "training/promotion/services/release.py",
        "training/promotion/services/rollouts.py",
        "training/promotion/services/live_set.py",
    }
    for module in (
        "training/promotion/services/release.py",
        "training/promotion/services/rollouts.py",
        "training/promotion/services/live_set.py",
    ):
        assert "AuditAction.LIVE_SWITCHED" in (root / module).read_text(), module


@pytest.mark.django_db
def test_an_audit_event_is_written_once():
    from training.promotion.models import AuditAction, AuditEvent, AuditImmutable
    from training.services.audit import audit_record

    event = audit_record(action=AuditAction.LIVE_SWITCHED, deployment=None, detail="x")
    event.detail = "rewritten"
    with pytest.raises(AuditImmutable, match="an event cannot be changed"):
        event.save()
    with pytest.raises(AuditImmutable, match="an event cannot be deleted"):
        event.delete()
    with pytest.raises(AuditImmutable, match="the audit log is append-only"):
        AuditEvent.objects.filter(pk=event.pk).update(detail="y")
    assert AuditEvent.objects.get(pk=event.pk).detail == "x"
