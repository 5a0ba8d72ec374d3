"""What the evaluation and promotion pages show of the evidence, and the confirmation that
approval asks for, through HTTP: the verdict before the evidence and the evidence before the
buttons; approval that changes nothing until the approver has confirmed what it does (which
deployment, what share of its traffic, how to roll back), and asks again when that changed;
success per kind, the task-bootstrap gain and the decision curve, escaped."""

from __future__ import annotations

from django.test import Client
from django.utils.html import escape

from tests.promotion.evidence import (
    ENVIRONMENT,
    REFUND_GAIN,
    demo_like_items,
    evaluation_store,
    refund_curve,
    refund_everything_items,
)
from training.promotion.models import AuditAction, AuditEvent, PromotionStatus, Release
from training.promotion.services.promotion import promotion_request_create


def demo_request(registry, operator):
    config = {"generator": "vllm", "max_tokens": 16, "temperature": 0.0, "judge": {"model": "test-judge"}}
    evaluation = evaluation_store(
        registry.candidate,
        registry.deployment,
        registry.base_version,
        demo_like_items(),
        sources=ENVIRONMENT,
        config=config,
    )
    return promotion_request_create(
        candidate=registry.candidate, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
    )


def test_the_approvers_page_puts_the_verdict_first_and_the_evidence_above_the_buttons(
    client, registry, operator, approver
):
    promotion = demo_request(registry, operator)
    client.force_login(approver)
    html = client.get(f"/promotions/{promotion.pk}/").content.decode()
    order = [html.index(marker) for marker in ('id="verdict"', 'id="signals"', 'id="monitors"', 'id="approve"')]
    assert order == sorted(order), order
    verdict = html[html.index('id="verdict"') : html.index('id="signals"')]
    assert 'data-level="caution"' in verdict and "inconclusive" in verdict
    assert "9 items, 6 whole episodes per version" in verdict and "3 single turns" in verdict
    assert "Empty answers 33 % (live 33 %)" in verdict and "Cut off at the token limit 33 %" in verdict
    assert "Mean judge reward: not measured — no answer was judged" in verdict
    assert "Judge agreement: gate blocked" in verdict  # no operator ratings: the judge is unverified
    # The judge's figure reads "not measured", not 0.000, in the signals and the summary.
    row = html[html.index('id="signal-reward_diff"') :].split("</tr>", 1)[0]
    assert 'data-status="not measured"' in row and "0.000" not in row
    assert "not measured: no answer was judged" in html[html.index('id="judge-reward"') :].split("</tr>", 1)[0]
    # Nothing inconclusive is green; the regression check says why it is not a plain pass.
    win = html[html.index('id="signal-win_rate"') :].split("</tr>", 1)[0]
    assert 'data-status="inconclusive"' in win and 'class="num better"' not in win
    check = html[html[: html.index('data-code="regression"')].rindex("<li") :].split("</li>", 1)[0]
    assert 'class="check-warn"' in check and "no signal regresses, but" in check


def test_approval_asks_to_confirm_what_it_does_and_changes_nothing_until_then(client, registry, operator, approver):
    promotion = demo_request(registry, operator)
    client.force_login(approver)
    url = f"/promotions/{promotion.pk}/approve"
    asked = client.post(url, {"comment": "small but fine"})
    assert asked.status_code == 200
    html = asked.content.decode()
    assert f"Approve promotion #{promotion.pk}: smol → smol-v1?" in html
    assert "<b>100 %</b> of support-bot's requests through the gateway" in html
    assert "“Roll back to smol”" in html and "POST /api/v1/deployments/support-bot/rollback" in html
    assert html.index('id="verdict"') < html.index('id="confirm-approve"')  # the verdict again, first
    assert ">small but fine</textarea>" in html
    token = html.split('name="confirm" value="', 1)[1].split('"', 1)[0]
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.PENDING and not Release.objects.exists()
    assert not AuditEvent.objects.filter(action=AuditAction.PROMOTION_APPROVED).exists()

    # The live version moved meanwhile: the confirmation was of another effect; asked again.
    stale = client.post(url, {"comment": "small but fine", "confirm": token + "0"})
    assert stale.status_code == 200 and 'id="confirm-stale"' in stale.content.decode()
    assert not Release.objects.exists()

    done = client.post(url, {"comment": "small but fine", "confirm": token})
    assert done.status_code == 302 and done["Location"] == f"/promotions/{promotion.pk}/"
    promotion.refresh_from_db()
    assert (promotion.status, promotion.decided_by, promotion.decision_comment) == (
        PromotionStatus.APPROVED,
        approver,
        "small but fine",
    )
    assert Release.objects.filter(promotion=promotion).count() == 1


def test_the_confirmation_keeps_the_csrf_check(registry, operator, approver):
    promotion = demo_request(registry, operator)
    guarded = Client(enforce_csrf_checks=True)
    guarded.force_login(approver)
    page = guarded.get(f"/promotions/{promotion.pk}/").content.decode()
    csrf = page.split('name="csrfmiddlewaretoken" value="', 1)[1].split('"', 1)[0]
    url = f"/promotions/{promotion.pk}/approve"
    asked = guarded.post(url, {"csrfmiddlewaretoken": csrf}).content.decode()
    token = asked.split('name="confirm" value="', 1)[1].split('"', 1)[0]
    assert guarded.post(url, {"confirm": token}).status_code == 403  # another site posting the form
    assert not Release.objects.exists()
    assert guarded.post(url, {"confirm": token, "csrfmiddlewaretoken": csrf}).status_code == 302
    assert Release.objects.filter(promotion=promotion).count() == 1


def test_the_api_approves_without_a_page_to_confirm_but_refuses_what_the_page_refuses(
    client, registry, operator, approver
):
    """The API call is the explicit act: no confirmation round; the same preconditions."""
    from tests.promotion.evidence import evaluation_finish

    evaluation = evaluation_store(
        registry.candidate,
        registry.deployment,
        registry.base_version,
        refund_everything_items(),
        status="running",
        sources=ENVIRONMENT,
    )
    promotion = promotion_request_create(
        candidate=registry.candidate, deployment=registry.deployment, evaluation=evaluation, requested_by=operator
    )
    evaluation_finish(evaluation, refund_everything_items(), extra={"gain": REFUND_GAIN})
    client.force_login(approver)
    page = client.post(f"/promotions/{promotion.pk}/approve", {"comment": "x"}, follow=True).content.decode()
    api = client.post(f"/api/v1/promotions/{promotion.pk}/approve", {"comment": "x"}, "application/json")
    assert api.status_code == 409
    # Refused for the same first unmet precondition (the policy violations once the harm check
    # counts them, the late kinds' regression before), in the same words.
    (error,) = api.json()["errors"]
    assert error["field"] in ("evaluation", "regression_override_reason")
    flash = page[page.index('class="flash-error">') :].split("</li>", 1)[0]
    assert escape(error["reason"]) in flash
    assert not Release.objects.exists()
    promotion.refresh_from_db()
    assert promotion.status == PromotionStatus.PENDING


def test_the_evaluation_page_shows_success_by_kind_the_gain_and_the_decision_curve(client, registry, operator):
    curve = refund_curve()
    curve["x_label"] = "days <script>alert(1)</script>"
    evaluation = evaluation_store(
        registry.candidate,
        registry.deployment,
        registry.base_version,
        refund_everything_items(),
        sources=ENVIRONMENT,
        extra={"gain": REFUND_GAIN, "decision_curve": curve},
    )
    client.force_login(operator)
    html = client.get(f"/evaluations/{evaluation.pk}/").content.decode()
    gain = html[html.index('id="episode-gain"') :].split("</tr>", 1)[0]
    assert "+0.132" in gain and "[-0.039, +0.294]" in gain and "task-bootstrap over 64 tasks \u00d7 3 seeds" in gain
    violations = html[html.index('id="episode-violations"') :].split("</tr>", 1)[0]
    assert "31/144" in violations and "2/144" in violations and 'class="worse"' in violations
    kinds = html[html.index('id="by-kind"') :].split("</table>", 1)[0]
    assert kinds.count('<tr id="kind-') == 5
    late = kinds[kinds.index('id="kind-kind_success-late_near_line"') :].split("</tr>", 1)[0]
    assert 'data-status="regressed"' in late and "26%" in late and "95%" in late  # 5/19 vs 18/19
    figure = html[html.index('id="decision-curve"') :].split("</figure>", 1)[0]
    assert figure.count("<polyline") == 2 and "rule: 30" in figure
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in figure
