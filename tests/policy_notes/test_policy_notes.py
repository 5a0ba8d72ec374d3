"""Policy notes through the API, against PostgreSQL and the test judge server: the judge
proposes a note from many comments, an operator edits it, an approver approves it (an
audit row), and only then does the deployment's judge read it."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from feedback.models import JudgeTrigger, PolicyNote
from feedback.services.judging import judge_request, judge_run
from tests.factories import user_with_role
from tests.fixtures.judge import Reply, user_prompt
from tests.judge.conftest import VALID_JUDGEMENT
from tests.policy_notes.conftest import PROPOSAL
from training.promotion.models import AuditAction, AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(db):
    return user_with_role("operator", "olga")


@pytest.fixture
def approver(db):
    return user_with_role("approver", "ada")


def _propose(client, operator, deployment, judge_settings, reply=PROPOSAL, **extra):
    judge_settings.script(Reply.json(reply))
    client.force_login(operator)
    return client.post(
        "/api/v1/policy-notes/propose", {"deployment": deployment.name, **extra}, content_type="application/json"
    )


def test_the_judge_proposes_a_note_with_the_comments_that_support_and_contradict_it(
    client, operator, commented, judge_settings
):
    deployment, comments = commented
    response = _propose(client, operator, deployment, judge_settings)
    assert response.status_code == 201, response.content
    note = response.json()
    (version,) = note["versions"]
    assert note["approved_version"] is None
    assert version["author"] == "judge" and version["prompt_version"] == "policy-note/v2"
    assert version["rule_text"] == "status = delivered and delivered_days_ago ≤ 30 → refund; otherwise → answer"
    assert [c["id"] for c in version["supporting"]] == [c.pk for c in comments[:4]]
    assert [c["id"] for c in version["contradicting"]] == [comments[4].pk]
    assert version["read_comments"] == 5
    # The judge read every comment with what the turn knew (the lookup's row), under structured output.
    (request,) = judge_settings.requests
    prompt = user_prompt(request)
    assert "Delivered 12 days ago, inside 30 days: refund it." in prompt
    assert '"delivered_days_ago": 45' in prompt
    assert request["response_format"]["json_schema"]["name"] == "policy_note"


def test_an_answer_naming_an_item_it_was_not_shown_is_asked_again(client, operator, commented, judge_settings):
    deployment, _ = commented
    judge_settings.script(Reply.json({**PROPOSAL, "supporting": [1, 9]}))
    response = _propose(client, operator, deployment, judge_settings)
    assert response.status_code == 201
    assert len(judge_settings.requests) == 2
    assert "not accepted" in user_prompt(judge_settings.requests[1])


def test_bad_input_is_a_400_naming_the_field(client, operator, approver, commented, judge_settings):
    deployment, comments = commented
    client.force_login(operator)
    few = client.post(
        "/api/v1/policy-notes/propose",
        {"deployment": deployment.name, "comment_ids": [comments[0].pk]},
        content_type="application/json",
    )
    assert few.status_code == 400 and few.json()["errors"][0]["field"] == "comment_ids"
    unknown = client.post("/api/v1/policy-notes/propose", {"deployment": "nope"}, content_type="application/json")
    assert unknown.status_code == 400 and unknown.json()["errors"][0]["field"] == "deployment"
    assert judge_settings.requests == []

    note_id = _propose(client, operator, deployment, judge_settings).json()["id"]
    bad_rule = {
        "text": "Refund late ones.",
        "rule": {"conditions": [{"field": "d", "op": "~", "value": 1}], "action": "r"},
    }
    edit = client.post(f"/api/v1/policy-notes/{note_id}/versions", bad_rule, content_type="application/json")
    assert edit.status_code == 400
    assert edit.json()["errors"][0] == {"field": "rule", "reason": "conditions[0].op: one of =, !=, <, <=, >, >="}
    empty = client.post(f"/api/v1/policy-notes/{note_id}/versions", {"text": " "}, content_type="application/json")
    assert empty.status_code == 400 and empty.json()["errors"][0]["field"] == "text"
    client.force_login(approver)
    bad_version = client.post(
        f"/api/v1/policy-notes/{note_id}/approve", {"version": "x"}, content_type="application/json"
    )
    assert bad_version.status_code == 400 and bad_version.json()["errors"][0]["field"] == "version"


def test_edit_then_approve_the_latest_version_and_only_then_the_judge_reads_it(
    client, operator, approver, commented, judge_settings
):
    deployment, comments = commented
    note_id = _propose(client, operator, deployment, judge_settings).json()["id"]
    edited = {
        "text": "Refund a delivered order up to 30 days after delivery.",
        "rule": {
            "conditions": [
                {"field": "status", "op": "=", "value": "delivered"},
                {"field": "days_since_delivery", "op": "<=", "value": 30},
            ],
            "action": "refund",
            "otherwise": "answer",
        },
    }
    response = client.post(f"/api/v1/policy-notes/{note_id}/versions", edited, content_type="application/json")
    assert response.status_code == 201
    assert [v["number"] for v in response.json()["versions"]] == [2, 1]
    assert response.json()["versions"][0]["author"] == "person"
    assert len(response.json()["versions"][0]["supporting"]) == 4  # the comments stay with the note

    # Unapproved, the judge does not read it.
    turn = comments[0].message
    judge_settings.script(Reply.json(VALID_JUDGEMENT))
    result = judge_run(result=judge_request(message=turn, trigger=JudgeTrigger.MANUAL, enqueue=False))
    assert "approved policy note" not in user_prompt(judge_settings.requests[-1])
    assert list(result.policy_notes.all()) == []

    # An operator may not approve; an approver approves the latest version only.
    assert (
        client.post(
            f"/api/v1/policy-notes/{note_id}/approve", {"version": 2}, content_type="application/json"
        ).status_code
        == 403
    )
    client.force_login(approver)
    stale = client.post(f"/api/v1/policy-notes/{note_id}/approve", {"version": 1}, content_type="application/json")
    assert stale.status_code == 409 and stale.json()["errors"][0]["field"] == "version"
    approved = client.post(f"/api/v1/policy-notes/{note_id}/approve", {"version": 2}, content_type="application/json")
    assert approved.status_code == 200 and approved.json()["approved_version"] == 2
    again = client.post(f"/api/v1/policy-notes/{note_id}/approve", {"version": 2}, content_type="application/json")
    assert again.status_code == 409

    (event,) = AuditEvent.objects.filter(action=AuditAction.POLICY_NOTE_APPROVED)
    assert (event.actor, event.deployment) == (approver, deployment)
    assert (
        event.data["version"] == 2 and event.data["text"] == edited["text"] and event.data["replaces_version"] is None
    )

    # Approved, it is part of what the judge reads for every turn of that deployment.
    judge_settings.script(Reply.json(VALID_JUDGEMENT))
    result = judge_run(result=judge_request(message=turn, trigger=JudgeTrigger.MANUAL, enqueue=False))
    prompt = user_prompt(judge_settings.requests[-1])
    assert "approved policy note of this deployment: Refund a delivered order up to 30 days after delivery." in prompt
    assert "days_since_delivery ≤ 30 → refund" in prompt
    assert [v.number for v in result.policy_notes.all()] == [2]

    # A later edit leaves version 2 in use until it is approved in turn.
    client.force_login(operator)
    client.post(
        f"/api/v1/policy-notes/{note_id}/versions", {"text": "Refund within a week."}, content_type="application/json"
    )
    assert PolicyNote.objects.get(pk=note_id).approved_version.number == 2
    listed = client.get(f"/api/v1/policy-notes?deployment={deployment.name}").json()["notes"]
    assert [(n["latest_version"], n["approved_version"]) for n in listed] == [(3, 2)]
    assert json.loads(json.dumps(listed))  # plain JSON all through


def test_the_pages_show_each_role_what_it_may_do(client, operator, approver, commented, judge_settings):
    deployment, _ = commented
    note_id = _propose(client, operator, deployment, judge_settings).json()["id"]
    page = client.get(f"/judge/notes/{note_id}/").content.decode()
    assert "Never refund anything. &lt;b&gt;Ignore&lt;/b&gt; the policy." in page
    assert "Save as version 2" in page and "Approve version 1" not in page
    assert client.post(f"/judge/notes/{note_id}/approve", {"version": 1}).status_code == 403

    client.force_login(approver)
    page = client.get(f"/judge/notes/{note_id}/").content.decode()
    assert "Approve version 1" in page and "Save as version 2" not in page
    assert client.post(f"/judge/notes/{note_id}/edit", {"text": "x"}).status_code == 403
    assert client.post(f"/judge/notes/{note_id}/approve", {"version": 1}).status_code == 302
    assert PolicyNote.objects.get(pk=note_id).approved_version.number == 1
    assert f"/judge/notes/{note_id}/" in client.get("/judge/notes/").content.decode()


def test_the_list_reads_a_fixed_number_of_queries_however_many_notes(client, operator, commented, judge_settings):
    deployment, _ = commented
    _propose(client, operator, deployment, judge_settings)

    def count() -> int:
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/api/v1/policy-notes").status_code == 200
        return len(queries)

    one = count()
    second = _propose(client, operator, deployment, judge_settings).json()["id"]
    edit = {"text": "Refund within a week."}
    client.post(f"/api/v1/policy-notes/{second}/versions", edit, content_type="application/json")
    assert count() == one
