"""Reading policy notes for the pages and the API."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet

from feedback.models import Comment, PolicyNote, PolicyNoteVersion
from training.environments.policy_rules import RuleError, rule_parse
from training.serving.models import Deployment

_comments = Comment.objects.select_related("message").order_by("created_at", "id")


def policy_notes(*, deployment: Deployment | None = None) -> QuerySet[PolicyNote]:
    """Notes, newest first, with their versions (newest first) and those versions' comments."""
    versions = PolicyNoteVersion.objects.select_related("written_by", "approved_by").prefetch_related(
        Prefetch("supporting", queryset=_comments), Prefetch("contradicting", queryset=_comments)
    )
    notes = PolicyNote.objects.select_related("deployment", "approved_version").prefetch_related(
        Prefetch("versions", queryset=versions.order_by("-number"))
    )
    return notes.filter(deployment=deployment) if deployment is not None else notes


def policy_note_get(*, note_id: int) -> PolicyNote | None:
    return policy_notes().filter(pk=note_id).first()


def rule_text(rule: dict[str, Any] | None) -> str:
    if not rule:
        return ""
    try:
        return rule_parse(rule).text()
    except RuleError:
        return ""


def _comment_as_dict(c: Comment) -> dict[str, Any]:
    return {"id": c.pk, "trace_id": c.trace_id, "message_position": c.message.position, "body": c.body}


def version_as_dict(v: PolicyNoteVersion) -> dict[str, Any]:
    return {
        "number": v.number,
        "text": v.text,
        "rule": v.rule,
        "rule_text": rule_text(v.rule) or None,
        "author": v.author_kind,
        "written_by": v.written_by.username if v.written_by else None,
        "judge_model": v.judge_model or None,
        "prompt_version": v.prompt_version or None,
        "read_comments": v.read_comments,
        "supporting": [_comment_as_dict(c) for c in v.supporting.all()],
        "contradicting": [_comment_as_dict(c) for c in v.contradicting.all()],
        "created_at": v.created_at.isoformat(),
        "approved_by": v.approved_by.username if v.approved_by else None,
        "approved_at": v.approved_at.isoformat() if v.approved_at else None,
    }


def policy_note_as_dict(note: PolicyNote) -> dict[str, Any]:
    versions = list(note.versions.all())
    approved = next((v.number for v in versions if v.pk == note.approved_version_id), None)
    return {
        "id": note.pk,
        "deployment": note.deployment.name,
        "approved_version": approved,
        "latest_version": versions[0].number if versions else None,
        "versions": [version_as_dict(v) for v in versions],
        "created_at": note.created_at.isoformat(),
    }
