"""One audit trail for live: every route to the live pointer leaves exactly one row in the
pointer's trail (`LiveVersionChange`, written by `live_version_set` in the move's transaction)
with who moved it, why and how (`kind`), and the audit log, page and API, shows that row among
its events. No route writes a `live_switched` audit event of its own any more."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.db.models import ProtectedError

import training.promotion.services.release as release_service
from tests.factories import user_with_role
from tests.promotion.conftest import evaluation_row, live_moves, make_adapter_folder
from training.promotion.models import AuditAction, AuditEvent
from training.promotion.rollout_models import Rollout
from training.promotion.services.promotion import promotion_approve, promotion_request_create
from training.promotion.services.release import release_run
from training.promotion.services.release_plans import release_plan_create
from training.promotion.services.rollback import rollback_request
from training.promotion.services.rollouts import rollout_advance
from training.serving.models import Deployment, LiveVersion, LiveVersionChange, ModelVersion, ModelVersionStatus
from training.serving.services import base_model_register, live_version_set, model_version_create
from webapp.kernel.append_only import AuditImmutable

ROOT = Path(__file__).resolve().parents[2]


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


def shown(client, deployment: str) -> tuple[str, list[dict]]:
    """The audit log's page and its API's entries for `deployment`, read by an auditor."""
    client.force_login(user_with_role("approver", "audrey"))
    page = client.get("/audit/", {"deployment": deployment})
    api = client.get("/api/v1/audit", {"deployment": deployment})
    assert page.status_code == api.status_code == 200
    return page.content.decode(), api.json()["events"]


def no_live_switched_events() -> bool:
    return not AuditEvent.objects.filter(action=AuditAction.LIVE_SWITCHED).exists()


def test_prepare_model_and_set_live_each_leave_one_row_the_audit_log_shows(db, client, base_folder, adapter_folder):
    call_command("prepare_model", "local", "--path", str(base_folder), "--name", "m", "--live-for", "bot")
    call_command("register_version", "m-v2", "--base", "m", "--path", str(adapter_folder))
    call_command("set_live", "bot", "m-v2", "--no-load", "--reason", "hotfix")
    assert live_moves(Deployment.objects.get(name="bot")) == [
        (None, "m", "set", None, "prepare_model --live-for", None, None),
        ("m", "m-v2", "set", None, "hotfix", None, None),
    ]
    # Already live: the pointer does not move, and nothing is recorded.
    call_command("set_live", "bot", "m-v2", "--no-load")
    assert len(live_moves(Deployment.objects.get(name="bot"))) == 2
    assert no_live_switched_events()

    page, entries = shown(client, "bot")
    assert page.count("Live version switched · Set by a command") == 2
    assert "hotfix" in page and "prepare_model --live-for" in page
    assert [(e["action"], e["from_version"], e["to_version"], e["detail"], e["data"]) for e in entries] == [
        ("live_switched", "m", "m-v2", "hotfix", {"kind": "set"}),
        ("live_switched", None, "m", "prepare_model --live-for", {"kind": "set"}),
    ]
    assert all(e["id"] is None and e["live_change"] for e in entries)


def test_a_refused_switch_records_nothing(db, base_folder, adapter_folder):
    call_command("prepare_model", "local", "--path", str(base_folder), "--name", "m", "--live-for", "bot")
    base = ModelVersion.objects.get(name="m")
    failed = model_version_create(name="m-bad", base_model=base.base_model, path=adapter_folder, kind="lora")
    ModelVersion.objects.filter(pk=failed.pk).update(status=ModelVersionStatus.FAILED)
    with pytest.raises(CommandError, match="failed"):
        call_command("set_live", "bot", "m-bad", "--no-load")
    assert LiveVersion.objects.get(deployment__name="bot").version.name == "m"
    assert live_moves(Deployment.objects.get(name="bot")) == [
        (None, "m", "set", None, "prepare_model --live-for", None, None)
    ]


def test_demo_setup_serving_a_base_leaves_one_row(db, client, base_folder):
    base_model_register(name="tiny", path=base_folder)
    call_command("demo_setup", "--serve-base", "tiny")
    deployment = Deployment.objects.get(name="support-bot")
    assert live_moves(deployment) == [(None, "tiny", "set", None, "make demo", None, None)]
    call_command("demo_setup", "--serve-base", "tiny")  # a restart: already served, nothing new
    assert len(live_moves(deployment)) == 1
    page, entries = shown(client, "support-bot")
    assert "make demo" in page and [e["detail"] for e in entries] == ["make demo"]


def test_a_release_a_rollback_and_a_progressive_release_each_leave_one_row_the_audit_log_shows(
    client, registry, operator, approver, monkeypatch
):
    monkeypatch.setattr(release_service, "release_load", lambda version: {"loaded": "lora", "name": version.name})
    monkeypatch.setattr(release_service, "release_smoke", lambda version: {"tokens": 3, "content": "Hello"})

    def request():
        evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
        return promotion_request_create(
            candidate=registry.candidate, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
        )

    first = request()
    promoted = release_run(release_id=promotion_approve(promotion=first, user=approver).pk)
    back = release_run(release_id=rollback_request(deployment=registry.deployment, user=approver).pk)
    plan = release_plan_create(
        name="two-steps",
        deployment=registry.deployment,
        steps=[
            {"share": 0.05, "min_conversations": 4, "min_minutes": 10},
            {"share": 1.0, "min_conversations": 0, "min_minutes": 0},
        ],
    )
    second = request()  # made after the rollback: the withdrawn candidate may come back through it
    stepped = release_run(release_id=promotion_approve(promotion=second, user=approver, plan=plan).pk)
    rollout = Rollout.objects.get(release=stepped)
    assert len(live_moves(registry.deployment)) == 3  # the first step moved no pointer
    rollout_advance(rollout=rollout, user=approver, seen_step=0, seen_share=0.05)

    assert live_moves(registry.deployment) == [
        (None, "smol", "set", None, "", None, None),  # the fixture's, through the setter itself
        ("smol", "smol-v1", "promotion", "arno", f"promotion (release {promoted.pk})", first.pk, promoted.pk),
        ("smol-v1", "smol", "rollback", "arno", f"rollback (release {back.pk})", first.pk, back.pk),
        (
            "smol",
            "smol-v1",
            "promotion",
            "arno",
            f"progressive release {rollout.pk} complete",
            second.pk,
            stepped.pk,
        ),
    ]
    assert no_live_switched_events()

    page, entries = shown(client, "support-bot")
    for text in (
        f"promotion (release {promoted.pk})",
        f"rollback (release {back.pk})",
        f"progressive release {rollout.pk} complete",
        "Live version switched · Promotion (an approved request)",
        "Live version switched · Rollback",
    ):
        assert text in page, text
    moves = [e for e in entries if e["action"] == "live_switched"]
    assert [(e["actor"], e["data"]["kind"], e["promotion"], e["release"]) for e in moves] == [
        ("arno", "promotion", second.pk, stepped.pk),
        ("arno", "rollback", first.pk, back.pk),
        ("arno", "promotion", first.pk, promoted.pk),
        (None, "set", None, None),
    ]
    # A request's page shows the moves its releases made, among its own steps.
    request_page = client.get(f"/promotions/{first.pk}/").content.decode()
    assert request_page.count("Live version switched · ") == 2


def test_the_audit_log_pages_through_events_and_moves_as_one_list(client, registry, approver, tmp_path):
    from training.services.audit import audit_record

    for name in ("smol-v2", "smol-v3"):
        version = model_version_create(
            name=name, base_model=registry.base, kind="lora", path=make_adapter_folder(tmp_path / name)
        )
        live_version_set(deployment=registry.deployment, version=version, reason=f"to {name}")
        if name == "smol-v2":
            audit_record(action=AuditAction.JUDGE_CHANGED, deployment=registry.deployment, detail="between")
    client.force_login(approver)
    seen, before = [], None
    while True:
        query = {"deployment": "support-bot", "limit": 2, **({"before": before} if before else {})}
        page = client.get("/api/v1/audit", query).json()
        seen += [e["detail"] if e["action"] == "live_switched" else e["action"] for e in page["events"]]
        before = page["next_before"]
        if before is None:
            break
    assert seen == ["to smol-v3", "judge_changed", "to smol-v2", None]  # the fixture's move: no reason
    assert client.get("/api/v1/audit", {"before": "live-x"}).status_code == 400
    assert client.get("/api/v1/audit", {"before": "live-999999"}).status_code == 400


def test_every_route_to_live_goes_through_the_one_setter_and_nothing_else_writes_a_move():
    """The release, a progressive release completing and the hand route (commands, demo_setup,
    the scripts) call the pointer's setter, which alone writes the trail; no module writes a
    `live_switched` audit event beside it."""
    modules = [
        path
        for folder in ("feedback", "training", "webapp", "scripts")
        for path in (ROOT / folder).rglob("*.py")
        if "migrations" not in path.parts
    ]
    callers = {p.relative_to(ROOT).as_posix() for p in modules if re.search(r"\blive_version_set\(", p.read_text())}
    assert callers == {
        "training/serving/services.py",  # where it is defined
        "training/promotion/services/release.py",
        "training/promotion/services/rollouts.py",
        "training/promotion/services/live_set.py",
    }
    writers = {p.relative_to(ROOT).as_posix() for p in modules if "LiveVersionChange.objects.create(" in p.read_text()}
    assert writers == {"training/serving/services.py"}
    event_writes = re.compile(r"(audit_record|AuditEvent\.objects\.create)\([^)]*LIVE_SWITCHED", re.DOTALL)
    assert not [p for p in modules if event_writes.search(p.read_text())]


def test_a_move_is_written_once(registry, django_user_model, tmp_path):
    mover = django_user_model.objects.create_user("mover")
    version = model_version_create(
        name="smol-v2", base_model=registry.base, kind="lora", path=make_adapter_folder(tmp_path / "v2")
    )
    live_version_set(deployment=registry.deployment, version=version, user=mover, reason="why")
    move = LiveVersionChange.objects.get(to_version=version)
    move.reason = "rewritten"
    with pytest.raises(AuditImmutable, match="a move cannot be changed"):
        move.save()
    with pytest.raises(AuditImmutable, match="a move cannot be deleted"):
        move.delete()
    with pytest.raises(AuditImmutable, match="the trail of live moves is append-only"):
        LiveVersionChange.objects.filter(pk=move.pk).update(reason="y")
    assert LiveVersionChange.objects.get(pk=move.pk).reason == "why"
    if connection.vendor == "postgresql":
        with pytest.raises(Exception, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("UPDATE training_liveversionchange SET reason = 'x'")
        # An account's deletion blanks who moved it (SET_NULL), and changes nothing else.
        mover.delete()
        move = LiveVersionChange.objects.get(pk=move.pk)
        assert (move.changed_by_id, move.reason, move.to_version) == (None, "why", version)


def test_a_deployment_that_went_live_keeps_its_trail_it_cannot_be_deleted(db, base_folder, adapter_folder):
    # Moves made by command only: the trail is their one record.
    call_command("prepare_model", "local", "--path", str(base_folder), "--name", "m", "--live-for", "bot")
    call_command("register_version", "m-v2", "--base", "m", "--path", str(adapter_folder))
    call_command("set_live", "bot", "m-v2", "--no-load", "--reason", "hotfix")
    bot = Deployment.objects.get(name="bot")
    with pytest.raises(ProtectedError), transaction.atomic():
        bot.delete()
    assert len(live_moves(Deployment.objects.get(name="bot"))) == 2


@pytest.mark.parametrize(
    "before", ["live-", "live-x", "live-0", "-1", "1.5", "\u00b2", "999999", "live-99999999999999999999"]
)
def test_the_audit_page_refuses_a_cursor_that_names_no_entry_as_the_api_does(db, client, base_folder, before):
    call_command("prepare_model", "local", "--path", str(base_folder), "--name", "m", "--live-for", "bot")
    client.force_login(user_with_role("approver", "audrey"))
    page = client.get("/audit/", {"before": before})
    assert page.status_code == client.get("/api/v1/audit", {"before": before}).status_code == 400
    text = page.content.decode()
    assert "names no entry of the audit log" in text and "prepare_model --live-for" not in text
