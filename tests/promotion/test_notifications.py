"""The notifications page: the promotion requests waiting for the signed-in approver, with
their evidence, decided there through the promotion service: the requester never sees their
own request to decide and gets 403, so does anyone who may not approve; an unmet
precondition is a 409 naming it, a rejection without a reason a 400 naming `comment`, and
nothing changes on a refusal. Approving asks first to confirm what it does. The nav's count
is one query."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.promotion.conftest import evaluation_row, make_adapter_folder
from training.notifications.selectors import promotions_awaiting, promotions_awaiting_count
from training.promotion.models import AuditAction, AuditEvent, PromotionRequest, PromotionStatus, Release
from training.promotion.services.promotion import promotion_request_create
from training.serving.models import LiveVersion

XSS = "<script>window.__inbox_xss = 1</script>"
PAGE = "/notifications/"


def approve_url(promotion) -> str:
    return f"/notifications/promotions/{promotion.pk}/approve"


def reject_url(promotion) -> str:
    return f"/notifications/promotions/{promotion.pk}/reject"


def confirm_token(html: str) -> str:
    """The confirmation the approve button's first answer asks to post back."""
    return html.split('name="confirm" value="', 1)[1].split('"', 1)[0]


def approve_confirmed(client, promotion, comment: str = "", **kwargs):
    """Approve as the page does: ask, read what approval does, confirm it."""
    asked = client.post(approve_url(promotion), {"comment": comment}, **kwargs)
    assert asked.status_code == 200, asked.content[:500]
    return client.post(
        approve_url(promotion), {"comment": comment, "confirm": confirm_token(asked.content.decode())}, **kwargs
    )


def candidate(registry, tmp_path, name: str):
    from training.serving.services import model_version_create

    return model_version_create(
        name=name,
        base_model=registry.base,
        kind="lora",
        path=make_adapter_folder(tmp_path / name),
        parent=registry.base_version,
    )


def request_for(registry, version, user, *, note: str = "", status: str = "finished", snapshot_extra=None):
    evaluation = evaluation_row(version, registry.deployment, registry.base_version, status=status)
    promotion = promotion_request_create(
        candidate=version, deployment=registry.deployment, evaluation=evaluation, requested_by=user, note=note
    )
    if snapshot_extra:
        promotion.snapshot |= snapshot_extra
        promotion.save(update_fields=["snapshot"])
    return promotion


@pytest.fixture
def two_requests(registry, operator, approving_operator, tmp_path):
    """One request by olga (an operator) opened as a learning policy's, one by omar (who may
    also approve) with a note."""
    by_policy = request_for(
        registry,
        registry.candidate,
        operator,
        note="opened by the policy",
        snapshot_extra={
            "learning_policy": {
                "policy": 1,
                "name": "fix-lookups",
                "run": 7,
                "reason": f"3 new commented turns {XSS}",
                "provenance": {"turns": 3, "comments": 3, "customer_feedback": 0, "judge_results": 0, "episodes": 0},
                "checks": [{"code": "win_rate", "label": "Win rate vs live ≥ 0.60", "ok": True, "detail": "0.75"}],
            }
        },
    )
    by_omar = request_for(registry, candidate(registry, tmp_path, "smol-v2"), approving_operator, note=XSS)
    return by_policy, by_omar


def test_an_approver_sees_every_request_waiting_with_its_evidence_but_never_their_own(
    client, registry, two_requests, approver, approving_operator, operator
):
    by_policy, by_omar = two_requests
    assert [a.promotion.pk for a in promotions_awaiting(user=approver)] == [by_policy.pk, by_omar.pk]
    assert [a.promotion.pk for a in promotions_awaiting(user=approving_operator)] == [by_policy.pk]
    assert promotions_awaiting(user=operator) == [] and promotions_awaiting_count(user=operator) == 0

    client.force_login(approver)
    html = client.get(PAGE).content.decode()
    card = html[html.index(f'id="promotion-{by_policy.pk}"') : html.index(f'id="promotion-{by_omar.pk}"')]
    assert "Opened by learning policy" in card and "fix-lookups" in card and "run 7" in card
    assert "Trained on 3 turns (3 comments" in card and "Win rate vs live ≥ 0.60" in card
    assert 'class="win-rate">75.0%' in card and "against smol" in card
    assert f'formaction="{approve_url(by_policy)}"' in card and f'hx-post="{reject_url(by_policy)}"' in card
    assert XSS not in html and html.count("&lt;script&gt;window.__inbox_xss") == 2  # the reason and the note
    assert 'id="inbox-count"' in html and ">2</span>" in html[html.index('id="inbox-count"') :][:200]

    client.force_login(approving_operator)
    html = client.get(PAGE).content.decode()
    assert f'id="promotion-{by_policy.pk}"' in html and f'id="promotion-{by_omar.pk}"' not in html

    client.force_login(operator)
    response = client.get(PAGE)
    assert response.status_code == 200 and b'id="nothing-to-decide"' in response.content
    assert b"Approve and deploy" not in response.content


def test_approving_from_the_notification_queues_the_release_and_nothing_goes_live_by_itself(
    client, registry, two_requests, approver
):
    by_policy, _ = two_requests
    client.force_login(approver)
    # The button first says what approval does, in the request's card, and changes nothing.
    asked = client.post(approve_url(by_policy), {"comment": "evidence holds"})
    assert asked.status_code == 200
    html = asked.content.decode()
    card = html[html.index(f'id="promotion-{by_policy.pk}"') :]
    assert f'id="confirm-{by_policy.pk}"' in card and "Confirm what approving does" in card
    assert "<b>100 %</b> of support-bot's requests" in card and "replacing smol" in card
    assert "Roll back to smol" in card and "/api/v1/deployments/support-bot/rollback" in card
    assert ">evidence holds</textarea>" in card  # the comment is carried to the confirmation
    assert "has changed since you confirmed it" not in card
    by_policy.refresh_from_db()
    assert by_policy.status == PromotionStatus.PENDING and not Release.objects.exists()
    # A confirmation of another effect (the live version moved since) is asked again.
    stale = client.post(approve_url(by_policy), {"comment": "evidence holds", "confirm": "0:0:0:0"})
    assert stale.status_code == 200 and f'id="confirm-{by_policy.pk}"' in stale.content.decode()
    assert "has changed since you confirmed it" in stale.content.decode()
    assert not Release.objects.exists()
    response = client.post(approve_url(by_policy), {"comment": "evidence holds", "confirm": confirm_token(html)})
    assert response.status_code == 302 and response["Location"] == PAGE
    by_policy.refresh_from_db()
    assert by_policy.status == PromotionStatus.APPROVED and by_policy.decided_by == approver
    assert by_policy.decision_comment == "evidence holds"
    (release,) = Release.objects.filter(promotion=by_policy)
    assert release.status == "queued" and release.version == registry.candidate
    assert AuditEvent.objects.filter(
        promotion=by_policy, action=AuditAction.PROMOTION_APPROVED, actor=approver
    ).exists()
    # Approval asks for a release; only its worker switches the live version.
    assert LiveVersion.objects.get(deployment=registry.deployment).version == registry.base_version
    page = client.get(PAGE).content.decode()
    assert f"Approved promotion #{by_policy.pk}" in page and f'id="promotion-{by_policy.pk}"' not in page


def test_with_htmx_the_decided_card_replaces_the_request_and_the_count_follows(
    client, registry, two_requests, approver
):
    _, by_omar = two_requests
    client.force_login(approver)
    response = client.post(reject_url(by_omar), {"comment": "not yet"}, headers={"HX-Request": "true"})
    assert response.status_code == 200
    html = response.content.decode()
    assert f'id="promotion-{by_omar.pk}"' in html and "Rejected promotion" in html
    assert 'id="inbox-count"' in html and 'hx-swap-oob="true"' in html and ">1</span>" in html
    by_omar.refresh_from_db()
    assert by_omar.status == PromotionStatus.REJECTED and by_omar.decided_by == approver


def test_with_htmx_approving_asks_in_the_card_then_the_decided_card_replaces_it(
    client, registry, two_requests, approver
):
    by_policy, _ = two_requests
    client.force_login(approver)
    page = client.get(PAGE).content.decode()
    card = page[page.index(f'id="promotion-{by_policy.pk}"') :]
    # The card decides from the top: its verdict, then the evidence, then the buttons.
    verdict, evidence, button = (
        card.index(f'id="verdict-{by_policy.pk}"'),
        card.index('class="facts evidence"'),
        card.index("Approve and deploy…"),
    )
    assert verdict < evidence < button
    assert "4 items" in card and "inconclusive" in card.lower()  # a 0.75 win rate over 4 items decides nothing
    htmx = {"HX-Request": "true"}
    asked = client.post(approve_url(by_policy), {"comment": "ok"}, headers=htmx)
    assert asked.status_code == 200
    html = asked.content.decode()
    assert html.lstrip().startswith("<article") and f'id="confirm-{by_policy.pk}"' in html
    assert f'hx-post="{approve_url(by_policy)}"' in html and "Approve: send 100 % of support-bot to smol-v1" in html
    assert not Release.objects.exists()
    decided = client.post(approve_url(by_policy), {"comment": "ok", "confirm": confirm_token(html)}, headers=htmx)
    assert decided.status_code == 200 and "Approved promotion" in decided.content.decode()
    assert Release.objects.filter(promotion=by_policy).count() == 1


def test_the_requester_and_a_non_approver_are_refused_with_403_and_nothing_changes(
    client, registry, two_requests, approving_operator, operator
):
    by_policy, by_omar = two_requests
    client.force_login(approving_operator)
    assert client.post(approve_url(by_omar)).status_code == 403  # his own request
    assert client.post(reject_url(by_omar), {"comment": "mine"}).status_code == 403
    client.force_login(operator)
    assert client.post(approve_url(by_omar)).status_code == 403
    assert client.post(approve_url(by_policy)).status_code == 403
    assert client.get(approve_url(by_policy)).status_code in (403, 405)
    client.logout()
    assert client.post(approve_url(by_policy)).status_code == 302  # to the login page
    assert set(PromotionRequest.objects.values_list("status", flat=True)) == {PromotionStatus.PENDING}
    assert not Release.objects.exists()


def test_a_refusal_names_its_field_and_keeps_the_request_waiting(client, registry, approver, operator, tmp_path):
    running = request_for(registry, candidate(registry, tmp_path, "smol-v3"), operator, status="running")
    client.force_login(approver)
    refused = client.post(approve_url(running))
    assert refused.status_code == 409
    assert b"is not finished" in refused.content and b'role="alert"' in refused.content
    no_reason = client.post(reject_url(running), {"comment": "  "}, headers={"HX-Request": "true"})
    assert no_reason.status_code == 400 and b"comment: say why the request is rejected" in no_reason.content
    assert f'id="promotion-{running.pk}"'.encode() in no_reason.content  # the card, to swap in place
    assert client.post("/notifications/promotions/999999/approve").status_code == 404
    running.refresh_from_db()
    assert running.status == PromotionStatus.PENDING and not Release.objects.exists()


def test_the_nav_count_is_one_query_for_an_approver_and_none_for_anyone_else(
    registry, two_requests, approver, operator, django_assert_num_queries
):
    approver.has_perm("training.approve_promotion")  # the nav's permission checks load these first
    operator.has_perm("training.approve_promotion")
    with django_assert_num_queries(1):
        assert promotions_awaiting_count(user=approver) == 2
    with django_assert_num_queries(0):
        assert promotions_awaiting_count(user=operator) == 0


def test_the_page_reads_the_same_queries_however_many_requests_wait(client, registry, operator, approver, tmp_path):
    request_for(registry, registry.candidate, operator)
    client.force_login(approver)
    client.get(PAGE)
    with CaptureQueriesContext(connection) as one:
        client.get(PAGE)
    for i in range(2, 5):
        request_for(registry, candidate(registry, tmp_path, f"smol-v{i}"), operator)
    with CaptureQueriesContext(connection) as four:
        html = client.get(PAGE).content.decode()
    assert html.count('class="panel notification"') == 4
    assert len(four) == len(one), [q["sql"] for q in four.captured_queries]


def test_a_comment_with_a_nul_character_is_a_400_naming_comment_and_nothing_changes(
    client, registry, two_requests, approver
):
    # PostgreSQL text cannot hold NUL; a pasted or crafted one is bad input, not a 500.
    by_policy, by_omar = two_requests
    client.force_login(approver)
    approve = client.post(approve_url(by_policy), {"comment": "fine\x00"}, headers={"HX-Request": "true"})
    assert approve.status_code == 400 and b"comment: contains a NUL character" in approve.content
    reject = client.post(reject_url(by_omar), {"comment": "no\x00"})
    assert reject.status_code == 400 and b"comment: contains a NUL character" in reject.content
    # The request's own page: refused at the door (webapp/kernel/nul.py), never a 500.
    page = client.post(f"/promotions/{by_omar.pk}/reject", {"comment": "no\x00"})
    assert page.status_code == 400 and b"comment: contains a NUL character" in page.content
    assert set(PromotionRequest.objects.values_list("status", flat=True)) == {PromotionStatus.PENDING}
    assert (
        not Release.objects.exists()
        and not AuditEvent.objects.filter(promotion=by_policy).exclude(action=AuditAction.PROMOTION_REQUESTED).exists()
    )


def test_deciding_a_request_already_decided_says_so_and_offers_no_buttons(client, registry, two_requests, approver):
    """A double click, or a second approver a moment late: a 409 that says the request is
    already decided, without the page's JavaScript as with it, and no buttons to press again."""
    by_policy, _ = two_requests
    client.force_login(approver)
    assert approve_confirmed(client, by_policy, "ok").status_code == 302
    again = client.post(approve_url(by_policy), {"comment": "ok"})
    assert again.status_code == 409
    html = again.content.decode()
    assert f"Promotion #{by_policy.pk}: status: request {by_policy.pk} is approved" in html and 'role="alert"' in html
    late = client.post(reject_url(by_policy), {"comment": "too late"}, headers={"HX-Request": "true"})
    assert late.status_code == 409
    card = late.content.decode()
    assert f'id="promotion-{by_policy.pk}"' in card and "is approved" in card
    assert "Approve and deploy" not in card and f'hx-post="{reject_url(by_policy)}"' not in card
    # The nav's count follows: the request waits for nobody now.
    assert 'id="inbox-count"' in card and 'hx-swap-oob="true"' in card and ">1</span>" in card
    by_policy.refresh_from_db()
    assert by_policy.status == PromotionStatus.APPROVED and Release.objects.filter(promotion=by_policy).count() == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_approvers_deciding_at_once_one_approves_or_rejects_and_the_other_is_told(
    client, registry, operator, approver, second_approver, monkeypatch
):
    """Approve and reject pressed at the same moment by two approvers: the request row is
    locked while one decides, so the other reads the decision and gets a 409; never both, and
    never a release for a rejected request. The lock is held a moment longer here so that the
    two really overlap."""
    import threading
    import time

    from django.db import connections
    from django.test import Client

    import training.promotion.services.promotion as promotion_service

    promotion = request_for(registry, registry.candidate, operator)
    confirmed = promotion_service.promotion_approval_effect(promotion=promotion).token
    locked = promotion_service._locked

    def slow_locked(p):
        row = locked(p)
        time.sleep(0.5)
        return row

    monkeypatch.setattr(promotion_service, "_locked", slow_locked)
    barrier, results = threading.Barrier(2), {}

    def decide(user, url, comment):
        try:
            c = Client()
            c.force_login(user)
            barrier.wait()
            form = {"comment": comment, "confirm": confirmed}
            results[user.username] = c.post(url, form, headers={"HX-Request": "true"}).status_code
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=decide, args=(approver, approve_url(promotion), "ship it")),
        threading.Thread(target=decide, args=(second_approver, reject_url(promotion), "not yet")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results.values()) == [200, 409], results
    promotion.refresh_from_db()
    winner = "arno" if results["arno"] == 200 else "bea"
    assert promotion.decided_by.username == winner
    assert promotion.status == (PromotionStatus.APPROVED if winner == "arno" else PromotionStatus.REJECTED)
    assert Release.objects.filter(promotion=promotion).count() == (1 if winner == "arno" else 0)
    decisions = AuditEvent.objects.filter(
        promotion=promotion, action__in=[AuditAction.PROMOTION_APPROVED, AuditAction.PROMOTION_REJECTED]
    )
    assert decisions.count() == 1


def test_the_nav_count_costs_nothing_on_the_login_page_for_anyone_else_or_on_the_api(
    client, registry, two_requests, approver, operator
):
    """The context processor is on every template render: the login page (anonymous), an
    operator's page and the JSON API read no promotion request for it; an approver's page
    counts once."""
    table = PromotionRequest._meta.db_table

    def counts(response_of) -> tuple[int, int]:
        with CaptureQueriesContext(connection) as queries:
            response = response_of()
        return response.status_code, sum(f'FROM "{table}"' in q["sql"] and "COUNT(" in q["sql"] for q in queries)

    assert counts(lambda: client.get("/login/")) == (200, 0)
    client.force_login(operator)
    assert counts(lambda: client.get("/overview/")) == (200, 0)
    client.force_login(approver)
    assert counts(lambda: client.get("/overview/")) == (200, 1)
    assert counts(lambda: client.get("/api/v1/promotions")) == (200, 0)


def test_a_decision_needs_the_csrf_token_and_an_active_approver(registry, two_requests, approver):
    from django.test import Client

    by_policy, _ = two_requests
    guarded = Client(enforce_csrf_checks=True)
    guarded.force_login(approver)
    # A page elsewhere cannot post the button for the approver: no token, no decision.
    assert guarded.post(approve_url(by_policy), {"comment": "ok"}).status_code == 403
    html = guarded.get(PAGE).content.decode()
    token = html.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    approver.is_active = False
    approver.save(update_fields=["is_active"])
    # Deactivated while signed in: the session no longer counts, to the login page.
    response = guarded.post(approve_url(by_policy), {"comment": "ok", "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and "/login/" in response["Location"]
    by_policy.refresh_from_db()
    assert by_policy.status == PromotionStatus.PENDING and not Release.objects.exists()
