"""The promotion API and pages: status codes and bodies people and scripts rely on, the
audit log's immutability, and escaping of untrusted content in evaluation reports."""

from __future__ import annotations

import base64

import pytest
from django.db import connection, transaction

from feedback.services.api_keys import api_key_create
from tests.factories import user_with_role
from tests.promotion.conftest import evaluation_row
from training.promotion.models import (
    AuditAction,
    AuditEvent,
    EvaluationItem,
    PromotionRequest,
    PromotionStatus,
)
from training.promotion.services.promotion import promotion_request_create
from webapp.kernel.append_only import AuditImmutable


@pytest.fixture
def pending(registry, operator):
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    return promotion_request_create(
        candidate=registry.candidate,
        deployment=registry.deployment,
        evaluation=evaluation,
        requested_by=operator,
        note="v1 fixes refunds",
    )


def as_user(client, user):
    client.force_login(user)
    return client


def test_requesting_through_the_api_and_reading_the_preconditions(client, registry, operator):
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    response = as_user(client, operator).post(
        "/api/v1/promotions",
        {"candidate": "smol-v1", "deployment": "support-bot", "evaluation": evaluation.pk, "note": "ship"},
        content_type="application/json",
    )
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["candidate"], body["from_version"], body["status"], body["requested_by"]) == (
        "smol-v1",
        "smol",
        "pending",
        "olga",
    )
    assert {c["code"]: c["ok"] for c in body["preconditions"]}["evaluation"] is True
    assert body["snapshot"]["judge_agreement"]["gate"]["allowed"] is False
    assert body["snapshot"]["monitors"] == {"job": None, "breaches": [], "flagged": False}

    bad = client.post(
        "/api/v1/promotions",
        {"candidate": "nope", "deployment": "support-bot", "evaluation": evaluation.pk},
        content_type="application/json",
    )
    assert bad.status_code == 400
    assert bad.json()["errors"][0]["field"] == "candidate"


def test_approval_rules_through_the_api(client, registry, pending, operator, approver):
    url = f"/api/v1/promotions/{pending.pk}/approve"
    refused = as_user(client, operator).post(url, {"comment": "me"}, content_type="application/json")
    assert refused.status_code == 403
    assert "training.approve_promotion" in refused.json()["detail"]

    own = user_with_role("approver", "olga-too")
    from django.contrib.auth.models import Group

    own.groups.add(Group.objects.get(name="operator"))
    mine = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    PromotionRequest.objects.filter(pk=pending.pk).update(status=PromotionStatus.CANCELLED)
    own_request = promotion_request_create(
        candidate=registry.candidate, deployment=registry.deployment, evaluation=mine, requested_by=own
    )
    response = as_user(client, own).post(f"/api/v1/promotions/{own_request.pk}/approve", {}, "application/json")
    assert response.status_code == 403
    assert "another approver must decide" in response.json()["detail"]

    accepted = as_user(client, approver).post(
        f"/api/v1/promotions/{own_request.pk}/approve", {"comment": "ok"}, "application/json"
    )
    assert accepted.status_code == 202
    release = accepted.json()
    assert (release["status"], release["version"], release["from_version"]) == ("queued", "smol-v1", "smol")
    assert client.get(f"/api/v1/releases/{release['id']}").json()["status"] == "queued"


def test_an_unfinished_evaluation_is_a_409_naming_it(client, registry, operator, approver):
    evaluation = evaluation_row(
        registry.candidate, registry.deployment, registry.base_version, status="running", done=2
    )
    promotion = promotion_request_create(
        candidate=registry.candidate, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
    )
    response = as_user(client, approver).post(f"/api/v1/promotions/{promotion.pk}/approve", {}, "application/json")
    assert response.status_code == 409
    assert response.json()["errors"] == [
        {"field": "evaluation", "reason": f"evaluation {evaluation.pk} is not finished (running, 2/4 items)"}
    ]


def test_deployment_keys_and_strangers_cannot_use_the_promotion_api(client, pending, registry, approver):
    key = api_key_create(deployment=registry.deployment, scopes=["ingest", "read", "feedback"]).plaintext
    response = client.post(
        f"/api/v1/promotions/{pending.pk}/approve", {}, "application/json", HTTP_AUTHORIZATION=f"Bearer {key}"
    )
    assert response.status_code in (401, 403)
    reviewer = user_with_role("reviewer", "rita")
    assert as_user(client, reviewer).get(f"/api/v1/promotions/{pending.pk}").status_code == 403
    client.logout()
    basic = base64.b64encode(b"arno:pw-for-tests-1").decode()
    ok = client.get(f"/api/v1/promotions/{pending.pk}", HTTP_AUTHORIZATION=f"Basic {basic}")
    assert ok.status_code == 200 and ok.json()["status"] == "pending"


def test_the_audit_log_cannot_be_changed(registry, pending):
    event = AuditEvent.objects.get(action=AuditAction.PROMOTION_REQUESTED)
    event.detail = "nothing happened"
    with pytest.raises(AuditImmutable):
        event.save()
    with pytest.raises(AuditImmutable):
        event.delete()
    with pytest.raises(AuditImmutable):
        AuditEvent.objects.filter(pk=event.pk).update(detail="x")
    with pytest.raises(AuditImmutable):
        AuditEvent.objects.all().delete()
    if connection.vendor == "postgresql":
        for sql in ("UPDATE training_auditevent SET detail = 'x'", "DELETE FROM training_auditevent"):
            with pytest.raises(Exception, match="append-only"), transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(sql)
    event.refresh_from_db()
    assert event.detail == "v1 fixes refunds"


def test_the_audit_api_pages_newest_first_in_constant_queries(
    client, registry, pending, approver, django_assert_num_queries
):
    from training.promotion.services.promotion import promotion_reject

    promotion_reject(promotion=pending, user=approver, comment="not yet")
    as_user(client, approver)
    # session, user, two permission queries, the deployment, the events and the live pointer's
    # moves (versions joined)
    with django_assert_num_queries(7):
        first = client.get("/api/v1/audit?deployment=support-bot&limit=1").json()
    assert [e["action"] for e in first["events"]] == ["promotion_rejected"]
    assert first["events"][0]["actor"] == "arno" and first["events"][0]["to_version"] == "smol-v1"
    rest = client.get(f"/api/v1/audit?deployment=support-bot&before={first['next_before']}").json()
    # The base went live first (the fixture's move, from the pointer's trail).
    assert [e["action"] for e in rest["events"]] == ["promotion_requested", "live_switched"]
    assert rest["events"][1]["to_version"] == "smol" and rest["next_before"] is None
    assert client.get("/api/v1/audit?limit=0").status_code == 400
    for bad in ("\u00b2", "9" * 30, "-1"):
        refused = client.get("/api/v1/audit", {"before": bad})
        assert refused.status_code == 400 and refused.json()["errors"][0]["field"] == "before"
    refused = client.get("/api/v1/audit", {"limit": "\u00b2"})
    assert refused.status_code == 400 and refused.json()["errors"][0]["field"] == "limit"


def test_pages_render_for_each_role_and_the_admin_offers_no_edit(client, registry, pending, operator, approver):
    as_user(client, operator)
    page = client.get("/models/")
    assert page.status_code == 200 and b"smol-v1" in page.content
    request_page = client.get(f"/promotions/{pending.pk}/").content.decode()
    assert "Not the requester" in request_page and "you requested this promotion" in request_page
    assert 'id="approve"' not in request_page  # the requester gets no approve button
    assert client.post(f"/promotions/{pending.pk}/approve").status_code == 403
    assert client.get("/audit/").status_code == 200

    as_user(client, approver)
    request_page = client.get(f"/promotions/{pending.pk}/").content.decode()
    assert 'id="approve"' in request_page and "v1 fixes refunds" in request_page
    reviewer = user_with_role("reviewer", "rita")
    assert as_user(client, reviewer).get(f"/promotions/{pending.pk}/").status_code == 403

    admin = type(operator).objects.create_superuser("root", "r@example.com", "pw")
    as_user(client, admin)
    event = AuditEvent.objects.first()
    assert client.get(f"/admin/training/auditevent/{event.pk}/change/").status_code == 200  # view only
    assert client.post(f"/admin/training/auditevent/{event.pk}/delete/").status_code == 403
    assert b'name="_save"' not in client.get(f"/admin/training/auditevent/{event.pk}/change/").content


def test_the_page_approve_button_refuses_with_the_reason(client, registry, operator, approver):
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version, status="queued", done=0)
    promotion = promotion_request_create(
        candidate=registry.candidate, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
    )
    response = as_user(client, approver).post(f"/promotions/{promotion.pk}/approve", {"comment": "x"}, follow=True)
    assert f"evaluation {evaluation.pk} is not finished (queued" in response.content.decode()
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.PENDING


def test_evaluation_report_escapes_trace_content(client, registry, operator):
    evaluation = evaluation_row(registry.candidate, registry.deployment, registry.base_version)
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    EvaluationItem.objects.create(
        evaluation=evaluation,
        position=0,
        key=f"trace:1:{hostile}",
        messages=[{"role": "user", "content": hostile}],
        done=True,
        candidate={"message": {"role": "assistant", "content": hostile}, "reward": 1.0, "reason": hostile},
        baseline={
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": hostile, "arguments": hostile}}],
            }
        },
        outcome="win",
    )
    as_user(client, operator)
    for url in (f"/evaluations/{evaluation.pk}/", f"/evaluations/{evaluation.pk}/items/0/"):
        response = client.get(url)
        html = response.content.decode()
        assert response.status_code == 200
        assert "<script>alert" not in html and "<img src=x" not in html
        assert "&lt;script&gt;" in html
        assert "script-src 'self'" in response["Content-Security-Policy"]


def test_listing_requests_waiting_for_a_decision(client, registry, pending, operator, django_assert_num_queries):
    as_user(client, operator)
    with django_assert_num_queries(5):  # session, user, two permission queries, the requests (joined)
        body = client.get("/api/v1/promotions?status=pending").json()
    assert [(p["id"], p["candidate"], p["requested_by"]) for p in body["promotions"]] == [
        (pending.pk, "smol-v1", "olga")
    ]
    assert client.get("/api/v1/promotions?status=rejected").json() == {"promotions": []}
    assert client.get("/api/v1/promotions?status=nope").status_code == 400
    assert as_user(client, user_with_role("reviewer", "rita")).get("/api/v1/promotions").status_code == 403
