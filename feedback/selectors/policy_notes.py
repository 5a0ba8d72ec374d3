"""Reading policy notes: the approved versions a deployment's judge reads."""

from __future__ import annotations

import contextlib

from django.db.models import F

from feedback.judge.prompts import FeedbackItem
from feedback.models import PolicyNoteVersion
from training.environments.policy_rules import RuleError, rule_parse
from training.serving.models import Deployment

NOTES_IN_PROMPT = 20


def policy_notes_approved(*, deployment: Deployment | None) -> list[PolicyNoteVersion]:
    """The approved version of each of `deployment`'s notes, oldest note first (none for
    data of no deployment). A version edited after approval is not among them until it
    is approved in turn."""
    if deployment is None:
        return []
    return list(
        PolicyNoteVersion.objects.filter(note__deployment=deployment, note__approved_version_id=F("pk")).order_by(
            "note__created_at", "note_id"
        )[:NOTES_IN_PROMPT]
    )


def policy_note_item(version: PolicyNoteVersion) -> FeedbackItem:
    """An approved note as the judge is shown it, beside the turn's own feedback."""
    text = version.text
    if version.rule:
        with contextlib.suppress(RuleError):
            text = f"{text} (as a rule: {rule_parse(version.rule).text()})"
    return FeedbackItem(kind="approved policy note of this deployment", text=text)
