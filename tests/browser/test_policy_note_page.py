"""A policy note in real headless Chromium: an operator (who also approves) asks the judge
for a note, sees it with the comments that support and contradict it (their text shown as
text), edits its rule in place, and approves it."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from feedback.models import PolicyNote
from tests.factories import user_with_role
from tests.fixtures.judge import Reply
from tests.policy_notes.conftest import PROPOSAL
from training.promotion.models import AuditAction, AuditEvent

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.mark.usefixtures("commented")
def test_propose_read_edit_and_approve_a_policy_note(open_page, judge_settings, screenshot):
    olga = user_with_role("operator", "olga")
    olga.groups.add(Group.objects.get(name="approver"))
    judge_settings.script(Reply.json(PROPOSAL))

    page = open_page(olga)
    page.goto("/judge/notes/")
    page.locator("select[name=deployment]").select_option(label="support-desk")
    page.locator("button:has-text('Propose a note')").click()
    page.wait_for_selector("h1:has-text('Policy note')")
    note = PolicyNote.objects.get()
    assert page.url.endswith(f"/judge/notes/{note.pk}/")

    assert "Not approved: the judge does not read this note." in page.inner_text("#latest")
    assert page.locator(".supporting li").count() == 4
    assert "Delivered 12 days ago, inside 30 days: refund it." in page.inner_text(".supporting")
    contradicting = page.locator(".contradicting")
    assert "Never refund anything. <b>Ignore</b> the policy." in contradicting.inner_text()
    assert contradicting.locator("b").count() == 0  # a comment's markup is text, never markup

    page.evaluate("window.__same_page = true")
    edit = page.locator("#edit")
    edit.locator("input[name=rule]").fill("status = delivered and days ~ 30 -> refund")
    edit.locator("button[type=submit]").click()
    page.locator("#note [role=alert]:has-text('rule: conditions[1]')").wait_for()
    page.locator("#edit input[name=rule]").fill(
        "status = delivered and days_since_delivery <= 30 -> refund; otherwise -> answer"
    )
    page.locator("#edit textarea[name=text]").fill("Refund a delivered order up to 30 days after delivery.")
    page.locator("#edit button[type=submit]").click()
    page.locator("#note [role=status]:has-text('Saved as a new version.')").wait_for()
    assert "Version 2" in page.inner_text("#latest h2")
    assert (
        page.inner_text(".note-rule") == "status = delivered and days_since_delivery ≤ 30 → refund; otherwise → answer"
    )
    screenshot(page, "policy-note", element=page.locator("#note"))

    page.locator("button:has-text('Approve version 2')").click()
    page.locator("#latest .status-succeeded:has-text('Approved')").wait_for()
    assert page.evaluate("window.__same_page") is True
    assert PolicyNote.objects.get().approved_version.number == 2
    assert AuditEvent.objects.filter(action=AuditAction.POLICY_NOTE_APPROVED, actor=olga).count() == 1
