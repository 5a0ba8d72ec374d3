"""The trace list finds failed conversations: an Outcome column and filter (success, failure,
ungraded) with the grader's reason on hover and for screen readers, score, latency and token
columns, searches that leave the system prompt out unless asked, and a loading sign."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta

import pytest

from tests.feedback.test_trace_pages import LIST, listed

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
SYSTEM = "You are Acme's support agent. Refund orders only under the refund policy."


def episode(external_id: str, question: str, minutes: int, *, seconds: float = 4.2, tokens: int = 0, grades=None):
    start = T0 + timedelta(minutes=minutes)
    answer = {"role": "assistant", "content": "Done."}
    if tokens:
        answer["usage"] = {"prompt_tokens": tokens - 10, "completion_tokens": 10, "total_tokens": tokens}
    return {
        "external_id": external_id,
        "started_at": start.isoformat(),
        "ended_at": (start + timedelta(seconds=seconds)).isoformat(),
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}, answer],
        **({"grades": grades} if grades is not None else {}),
    }


@pytest.fixture
def graded(deployment, ingest):
    return ingest(
        deployment,
        episode(
            "refund-1",
            "I want my money back for order A1",
            3,
            seconds=0.85,
            tokens=1234,
            grades=[{"outcome": "failure", "score": 0.25, "reason": "refunded <b>A2</b>, not A1"}],
        ),
        episode("track-1", "Where is my parcel?", 2, seconds=75, grades=[{"outcome": "success", "score": 1}]),
        episode("track-2", "Where is my blender?", 1),
    )


def test_the_outcome_filter_finds_failed_conversations(operator_client, graded):
    assert listed(operator_client.get(LIST)) == ["refund-1", "track-1", "track-2"]
    assert listed(operator_client.get(LIST, {"outcome": "failure"})) == ["refund-1"]
    assert listed(operator_client.get(LIST, {"outcome": "success"})) == ["track-1"]
    assert listed(operator_client.get(LIST, {"outcome": "ungraded"})) == ["track-2"]
    # Run status is about the calls, not the task: every one of these ran "ok".
    assert listed(operator_client.get(LIST, {"status": "error"})) == []
    refused = operator_client.get(LIST, {"outcome": "bad"}).content.decode()
    assert "Ignored" in refused and "outcome" in refused


def test_each_row_shows_its_outcome_with_the_reason_escaped_and_its_score_latency_and_tokens(operator_client, graded):
    body = operator_client.get(LIST).content.decode()
    rows = {m.group(1): m.group(0) for m in re.finditer(r'<tr class="trace-row".*?>([^<]+)</a>.*?</tr>', body, re.S)}
    failure = rows["refund-1"]
    # The reason is on hover (title) and in visually hidden text for screen readers; escaped.
    assert 'title="refunded &lt;b&gt;A2&lt;/b&gt;, not A1"' in failure
    assert '<span class="visually-hidden">: refunded &lt;b&gt;A2&lt;/b&gt;, not A1</span>' in failure
    assert "✗ failure" in failure and ">0.25<" in failure
    assert ">850 ms<" in failure and ">1,234<" in failure
    assert "✓ success" in rows["track-1"] and ">1.00<" in rows["track-1"] and ">1 min<" in rows["track-1"]
    assert "ungraded" in rows["track-2"] and ">4.2 s<" in rows["track-2"] and ">—<" in rows["track-2"]
    for header in ("Outcome", "Score", "Latency", "Tokens"):
        assert f">{header}</th>" in body
    # Filters show a loading sign while their results are on the way.
    assert 'hx-indicator="#list-loading"' in body and 'id="list-loading" class="htmx-indicator"' in body


def test_a_search_leaves_system_messages_out_unless_asked(operator_client, graded, ingest_key, client):
    # Every trace's system prompt says "refund"; only one customer asked about money back.
    assert listed(operator_client.get(LIST, {"q": "refund"})) == []
    assert listed(operator_client.get(LIST, {"q": "money"})) == ["refund-1"]
    assert listed(operator_client.get(LIST, {"q": "refund", "system": "yes"})) == ["refund-1", "track-1", "track-2"]
    form = operator_client.get(LIST, {"q": "refund", "system": "yes"}).content.decode()
    assert re.search(r'<input type="checkbox" name="system" value="yes" id="id_system" checked>', form)
    api = client.get("/api/v1/traces", {"q": "refund"}, HTTP_AUTHORIZATION=f"Bearer {ingest_key}").json()
    assert api["results"] == []
    api = client.get(
        "/api/v1/traces",
        {"q": "refund", "system": "yes", "outcome": "failure"},
        HTTP_AUTHORIZATION=f"Bearer {ingest_key}",
    ).json()
    assert [t["external_id"] for t in api["results"]] == ["refund-1"]


def test_a_queue_built_from_the_outcome_filter_takes_the_failed_traces(operator_client, graded):
    from feedback.models import AnnotationQueue

    response = operator_client.post(
        "/queues/new", {"name": "Failures", "limit": 10, "lock_minutes": 10, "outcome": "failure"}
    )
    queue = AnnotationQueue.objects.get()
    assert response.status_code == 302 and queue.filters == {"outcome": ["failure"]}
    assert [i.trace.external_id for i in queue.items.select_related("trace")] == ["refund-1"]


def test_the_trace_page_shows_metadata_as_indented_json_escaped_and_the_grades(operator_client, deployment, ingest):
    (trace,) = ingest(
        deployment,
        episode(
            "meta-1",
            "Where is my parcel?",
            0,
            grades=[{"outcome": "failure", "reason": "gave <b>no</b> tracking link", "source": "checker"}],
        )
        | {"metadata": {"customer_tier": "gold", "note": "<script>alert(1)</script>", "tags": ["a", "b"]}},
    )
    body = operator_client.get(f"/traces/{trace.pk}/").content.decode()
    start = body.index('<pre class="json">') + len('<pre class="json">')
    meta = html.unescape(body[start : body.index("</pre>", start)])
    # JSON (double quotes, indented, lists as JSON), not a Python dict; its text escaped.
    assert '"customer_tier": "gold"' in meta and '  "tags": [' in meta and "{'" not in meta
    assert '"note": "<script>alert(1)</script>"' in meta and "<script>alert" not in body
    grades = body[body.index('id="side-grades"') :]
    assert "✗ failure" in grades and "gave &lt;b&gt;no&lt;/b&gt; tracking link" in grades and "by checker" in grades
