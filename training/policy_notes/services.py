"""Policy notes: the judge proposes one from many comments of a deployment, an operator
edits it (each edit a new version), an approver approves a version (an audit row). The
deployment's judge reads approved versions only (`feedback.selectors.policy_notes`).

A proposal is one judge call made while the operator waits (bounded by the judge's
deadline), not a background job: it writes nothing until the answer is in.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from feedback.judge.client import JudgeCallFailed, JudgeEndpoint, JudgeNotConfigured
from feedback.judge.policy_notes import TEXT_MAX, CommentItem, propose_note
from feedback.judge.prompts import CURRENT_POLICY_NOTE
from feedback.models import Comment, Message, MessageRole, PolicyNote, PolicyNoteAuthor, PolicyNoteVersion
from feedback.selectors.judge import judge_endpoint_for
from feedback.selectors.traces import message_as_openai
from training.environments.policy_rules import RuleError, rule_parse
from training.inference.codec import message_served_text
from training.promotion.models import AuditAction
from training.services.audit import audit_record
from training.serving.models import Deployment
from webapp.kernel.errors import DomainError

# Who may approve: the approvers of promotions. A note changes what the judge rewards,
# and so what training teaches, as much as a promotion changes what is served.
APPROVE = "training.approve_promotion"
# Who may propose (a judge call) and edit: whoever may spend judge calls (operators).
PROPOSE = "feedback.add_judgejob"
MIN_COMMENTS = 2
MAX_COMMENTS = 30
RAW_OUTPUT_MAX = 50_000


class PolicyNoteError(DomainError):
    """A request that cannot be done: `field` names the input, `status` the HTTP answer
    (400 bad input, 403 not allowed, 409 the note's state, 502 the judge)."""

    def __init__(self, field: str, reason: str, *, status: int = 400) -> None:
        super().__init__(reason, field=field)
        self.status = status


def policy_note_comments(*, deployment: Deployment, limit: int = MAX_COMMENTS) -> list[Comment]:
    """The latest `limit` comments on `deployment`'s assistant turns, oldest first."""
    latest = (
        Comment.objects.filter(trace__deployment=deployment, message__role=MessageRole.ASSISTANT)
        .select_related("message")
        .order_by("-created_at", "-id")[:limit]
    )
    return list(reversed(latest))


def _comment_item(comment: Comment) -> CommentItem:
    last_tool = (
        Message.objects.filter(trace_id=comment.trace_id, role=MessageRole.TOOL, position__lt=comment.message.position)
        .order_by("-position")
        .first()
    )
    facts = ""
    if last_tool is not None:
        content = message_as_openai(last_tool).get("content")
        facts = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    body = f'{comment.body} (about: "{comment.quote}")' if comment.quote else comment.body
    return CommentItem(facts=facts, turn=message_served_text(message_as_openai(comment.message)), comment=body)


def policy_note_propose(
    *,
    deployment: Deployment,
    requested_by: Any,
    comment_ids: list[int] | None = None,
    limit: int = MAX_COMMENTS,
    endpoint: JudgeEndpoint | None = None,
) -> PolicyNote:
    """Ask the deployment's judge for the rule its comments state (the given ones, else the
    latest `limit`), and store it as version 1 of a new, unapproved note."""
    if not MIN_COMMENTS <= limit <= MAX_COMMENTS:
        raise PolicyNoteError("limit", f"between {MIN_COMMENTS} and {MAX_COMMENTS}")
    if comment_ids:
        if len(comment_ids) > MAX_COMMENTS:
            raise PolicyNoteError("comment_ids", f"at most {MAX_COMMENTS} comments")
        found = {
            c.pk: c
            for c in Comment.objects.filter(
                pk__in=comment_ids, trace__deployment=deployment, message__role=MessageRole.ASSISTANT
            ).select_related("message")
        }
        missing = [i for i in comment_ids if i not in found]
        if missing:
            raise PolicyNoteError(
                "comment_ids", f"comment {missing[0]} is not a comment on an assistant turn of {deployment.name}"
            )
        comments = [found[i] for i in dict.fromkeys(comment_ids)]
    else:
        comments = policy_note_comments(deployment=deployment, limit=limit)
    if len(comments) < MIN_COMMENTS:
        raise PolicyNoteError(
            "comment_ids" if comment_ids else "deployment",
            f"a note is drawn from at least {MIN_COMMENTS} comments on assistant turns; {len(comments)} found",
        )
    try:
        endpoint = endpoint or judge_endpoint_for(deployment=deployment)
    except JudgeNotConfigured as exc:
        raise PolicyNoteError("deployment", str(exc), status=409) from None
    try:
        answer = propose_note(items=[_comment_item(c) for c in comments], endpoint=endpoint)
    except JudgeCallFailed as exc:
        raise PolicyNoteError("judge", f"the judge gave no usable note: {exc.reason}", status=502) from None
    proposal = answer.value
    with transaction.atomic():
        note = PolicyNote.objects.create(deployment=deployment, created_by=_person(requested_by))
        version = PolicyNoteVersion.objects.create(
            note=note,
            number=1,
            text=proposal.text,
            rule=proposal.rule.as_dict() if proposal.rule else None,
            read_comments=len(comments),
            author_kind=PolicyNoteAuthor.JUDGE,
            written_by=_person(requested_by),
            judge_model=endpoint.model,
            prompt_version=CURRENT_POLICY_NOTE.version,
            raw_output=answer.raw[:RAW_OUTPUT_MAX],
        )
        version.supporting.set([comments[i] for i in proposal.supporting])
        version.contradicting.set([comments[i] for i in proposal.contradicting])
    return note


def _person(user: Any) -> Any:
    return user if getattr(user, "pk", None) else None


def _latest(note: PolicyNote) -> PolicyNoteVersion:
    return note.versions.order_by("-number").first()


@transaction.atomic
def policy_note_edit(*, note: PolicyNote, text: str, rule: dict[str, Any] | None, user: Any) -> PolicyNoteVersion:
    """A new version of `note` with `text` and `rule` (None: words only), keeping the
    comments of the version before. The approved version stays what the judge reads
    until this one is approved."""
    text = (text or "").strip()
    if not text:
        raise PolicyNoteError("text", "the note needs its rule in words")
    if len(text) > TEXT_MAX:
        raise PolicyNoteError("text", f"at most {TEXT_MAX} characters ({len(text)} given)")
    try:
        parsed = rule_parse(rule) if rule is not None else None
    except RuleError as exc:
        raise PolicyNoteError("rule", str(exc)) from None
    PolicyNote.objects.select_for_update().filter(pk=note.pk).first()  # one edit at a time numbers versions
    before = _latest(note)
    number = (note.versions.aggregate(n=Max("number"))["n"] or 0) + 1
    version = PolicyNoteVersion.objects.create(
        note=note,
        number=number,
        text=text,
        rule=parsed.as_dict() if parsed else None,
        read_comments=before.read_comments if before else 0,
        author_kind=PolicyNoteAuthor.PERSON,
        written_by=_person(user),
    )
    if before is not None:
        version.supporting.set(before.supporting.all())
        version.contradicting.set(before.contradicting.all())
    return version


@transaction.atomic
def policy_note_approve(*, note: PolicyNote, number: int, user: Any) -> PolicyNoteVersion:
    """Approve version `number` of `note`, the latest one (an approver approves what they
    saw, not an edit made since): the deployment's judge reads it from now on. Writes an
    audit row with the text and rule approved and the version it replaces."""
    if not (getattr(user, "is_authenticated", False) and user.has_perm(APPROVE)):
        raise PolicyNoteError("user", f"approving a policy note needs {APPROVE} (the approver role)", status=403)
    note = PolicyNote.objects.select_for_update().get(pk=note.pk)
    latest = _latest(note)
    if latest is None or latest.number != number:
        shown = latest.number if latest else "none"
        raise PolicyNoteError("version", f"version {number} is not the latest (v{shown}): read it first", status=409)
    if note.approved_version_id == latest.pk:
        raise PolicyNoteError("version", f"version {number} is already approved", status=409)
    previous = note.approved_version
    latest.approved_by, latest.approved_at = user, timezone.now()
    latest.save(update_fields=["approved_by", "approved_at"])
    note.approved_version = latest
    note.save(update_fields=["approved_version"])
    audit_record(
        action=AuditAction.POLICY_NOTE_APPROVED,
        deployment=note.deployment,
        actor=user,
        detail=f"policy note {note.pk} v{latest.number}: {latest.text}",
        data={
            "policy_note_id": note.pk,
            "version": latest.number,
            "text": latest.text,
            "rule": latest.rule,
            "replaces_version": previous.number if previous else None,
        },
    )
    return latest
