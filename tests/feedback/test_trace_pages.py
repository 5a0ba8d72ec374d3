"""The trace list and detail pages: filters, search, keyset pages, escaping, roles, queries."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from feedback.models import CustomerFeedback, Trace
from feedback.services.flags import trace_flag_set
from feedback.services.review import comment_add
from tests.factories import DeploymentFactory, user_with_role
from tests.feedback.conftest import TOOLS, tool_conversation

pytestmark = pytest.mark.django_db
LIST = "/traces/"
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def simple(external_id: str, text: str, minutes: int = 0, **extra) -> dict:
    return {
        "external_id": external_id,
        "started_at": (T0 + timedelta(minutes=minutes)).isoformat(),
        "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}],
        **extra,
    }


def listed(response) -> list[str]:
    """External ids in the order the list shows them."""
    return re.findall(r'class="trace-link" href="[^"]+">([^<]+)</a>', response.content.decode())


def test_pages_need_login_and_a_role_that_browses(client, tool_trace, reviewer):
    assert client.get(LIST).status_code == 302
    assert client.get(f"/traces/{tool_trace.id}/").status_code == 302
    client.force_login(reviewer)
    assert client.get(LIST).status_code == 403
    assert client.get(f"/traces/{tool_trace.id}/").status_code == 403
    assert client.get("/").url == "/queues/"
    client.force_login(user_with_role("approver", "april"))
    assert client.get(LIST).status_code == 200


def test_filters_narrow_the_list_and_live_in_the_url(operator_client, deployment, ingest, operator):
    other = DeploymentFactory(name="sales-bot")
    a, b, c = ingest(
        deployment,
        simple("refund-1", "I want a refund for my blender", 3, environment="web", status="error"),
        simple("track-1", "Where is my parcel", 2, environment="web"),
        simple("track-2", "Where is my blender parcel", 1, environment="phone"),
    )
    ingest(other, simple("sales-1", "Do you sell blenders", 4, environment="web"))
    comment_add(message=b.messages.get(position=1), author=operator, body="too curt")
    Trace.objects.filter(pk=c.pk).update(judge_reward=0.2)
    Trace.objects.filter(pk=a.pk).update(judge_reward=0.9)
    trace_flag_set(trace=c, name="wrong-tool", source="judge")
    trace_flag_set(trace=b, name="loop", source="rule")
    CustomerFeedback.objects.create(deployment=deployment, trace=a, rating_kind="thumbs", rating=-1)
    Trace.objects.filter(pk=a.pk).update(has_customer_feedback=True, feedback_rating=-1)

    def ids(**params):
        response = operator_client.get(LIST, params)
        assert response.status_code == 200
        return listed(response)

    assert ids() == ["sales-1", "refund-1", "track-1", "track-2"]
    assert ids(deployment=other.id) == ["sales-1"]
    assert ids(environment="web", deployment=deployment.id) == ["refund-1", "track-1"]
    assert ids(status="error") == ["refund-1"]
    assert ids(comment="yes") == ["track-1"]
    assert ids(comment="no") == ["sales-1", "refund-1", "track-2"]
    assert ids(feedback="yes") == ["refund-1"]
    assert ids(rating="negative") == ["refund-1"]
    assert ids(rating="positive") == []
    assert ids(reward_min="0.5") == ["refund-1"]
    assert ids(reward_max="0.5") == ["track-2"]
    assert ids(flag="wrong-tool") == ["track-2"]
    assert ids(flag="loop", environment="web") == ["track-1"]
    assert ids(flag="loop", environment="phone") == []
    assert ids(start="2026-11-01", end="2026-11-01") == ["sales-1", "refund-1", "track-1", "track-2"]
    assert ids(start="2026-11-02") == []
    # Full-text search: every word must occur ("blenders" matches: stemmed on PostgreSQL,
    # a substring on SQLite).
    assert ids(q="blender") == ["sales-1", "refund-1", "track-2"]
    assert ids(q="parcel blender") == ["track-2"]
    # A bad value is ignored and said so, never a 500.
    response = operator_client.get(LIST, {"reward_min": "lots", "start": "yesterday"})
    assert response.status_code == 200 and "Ignored" in response.content.decode()
    # Detail links carry the filter, so j/k walk the same list.
    response = operator_client.get(LIST, {"environment": "web", "comment": "yes"})
    assert f"/traces/{b.id}/?environment=web&amp;comment=yes" in response.content.decode()


@pytest.mark.postgres
def test_postgres_search_uses_stemming_phrases_and_exclusion(operator_client, deployment, ingest):
    ingest(
        deployment,
        simple("a", "my order was refunded twice", 2),
        simple("b", "please refund order 7781", 1),
        simple("c", "the refund never arrived", 0),
    )
    assert listed(operator_client.get(LIST, {"q": "refunds"})) == ["a", "b", "c"]
    assert listed(operator_client.get(LIST, {"q": '"never arrived"'})) == ["c"]
    assert listed(operator_client.get(LIST, {"q": "refund -7781"})) == ["a", "c"]
    # Tool-call arguments are searchable too.
    assert listed(operator_client.get(LIST, {"q": "A1"})) == []


def test_keyset_pages_cover_every_trace_once_and_htmx_gets_fragments(operator_client, deployment, ingest):
    # Equal timestamps in pairs: the id breaks ties so no row is skipped or repeated.
    ingest(deployment, *[simple(f"t{i:03d}", "hello", i // 2) for i in range(120)])
    seen: list[str] = []
    url = LIST
    pages = 0
    while url:
        response = operator_client.get(url, HTTP_HX_REQUEST="true") if pages else operator_client.get(url)
        body = response.content.decode()
        seen += listed(response)
        if pages:
            assert "<html" not in body and "<table" not in body  # just rows and the next button
        # "Load more" names the list's own address (its page may answer a POST elsewhere).
        match = re.search(r'hx-get="(/traces/\?[^"]+)"', body)
        url = match.group(1).replace("&amp;", "&") if match else None
        pages += 1
    assert pages == 3
    assert len(seen) == 120 and len(set(seen)) == 120
    # A filter change through htmx swaps only the results block.
    response = operator_client.get(LIST, {"q": "hello"}, HTTP_HX_REQUEST="true")
    assert 'id="results"' in response.content.decode() and "<html" not in response.content.decode()


def test_detail_shows_the_conversation_with_tool_calls_linked_to_results(operator_client, tool_trace):
    body = operator_client.get(f"/traces/{tool_trace.id}/").content.decode()
    assert body.count('class="msg msg-') == 5
    assert 'id="call-call_1"' in body and "→ result (#3)" in body
    assert 'result of <a href="#msg-2">lookup_order</a>' in body
    assert "&quot;order_id&quot;: &quot;A1&quot;" in body  # pretty-printed arguments
    assert "Tools (2)" in body and "Find an order by id" in body
    assert "chatcmpl-42" in body


def test_untrusted_content_is_escaped_everywhere(operator_client, deployment, ingest):
    evil = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=1"> [x](javascript:alert(1))'
    (trace,) = ingest(
        deployment,
        {
            "external_id": "<b>evil</b>",
            "environment": "<i>env</i>",
            "metadata": {"<k>": "<v>"},
            "tools": [{"type": "function", "function": {"name": "<t>", "description": "<script>d</script>"}}],
            "messages": [
                {"role": "user", "content": evil},
                {
                    "role": "assistant",
                    "content": evil,
                    "tool_calls": [{"id": "c<1>", "function": {"name": "<t>", "arguments": '{"a": "<script>"}'}}],
                },
            ],
        },
    )
    for url in (LIST, f"/traces/{trace.id}/", f"/traces/{trace.id}/messages/0/raw"):
        response = (
            operator_client.get(url, HTTP_HX_REQUEST="true" if "raw" in url else None)
            if "raw" in url
            else operator_client.get(url)
        )
        body = response.content.decode()
        assert "<script>window" not in body and "<img src=x" not in body and "<b>evil" not in body
        assert "<i>env" not in body and "<k>" not in body and "<script>d" not in body
    body = operator_client.get(f"/traces/{trace.id}/").content.decode()
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in body
    assert 'href="javascript' not in body
    assert "script-src 'self'" in operator_client.get(f"/traces/{trace.id}/")["Content-Security-Policy"]


def test_a_1mb_message_keeps_the_page_small_and_loads_in_full_on_demand(operator_client, deployment, ingest):
    huge = "lorem ipsum " * 90_000  # ~1 MB
    (trace,) = ingest(deployment, {"external_id": "big", "messages": [{"role": "user", "content": huge}]})
    response = operator_client.get(f"/traces/{trace.id}/")
    assert response.status_code == 200 and len(response.content) < 100_000
    assert "Show more (1.0\xa0MB in all)" in response.content.decode()
    full = operator_client.get(f"/traces/{trace.id}/messages/0/content")
    assert full["Content-Type"].startswith("text/plain") and full.content.decode() == huge
    fragment = operator_client.get(f"/traces/{trace.id}/messages/0/content", HTTP_HX_REQUEST="true")
    assert len(fragment.content) > 1_000_000 and 'id="text-0"' in fragment.content.decode()


def test_j_and_k_walk_the_filtered_list(operator_client, deployment, ingest):
    a, b, c, d = ingest(
        deployment,
        simple("a", "x", 4, environment="web"),
        simple("b", "x", 3, environment="phone"),
        simple("c", "x", 2, environment="web"),
        simple("d", "x", 1, environment="web"),
    )
    q = "?environment=web"
    assert operator_client.get(f"/traces/{a.id}/next{q}").url == f"/traces/{c.id}/{q}"
    assert operator_client.get(f"/traces/{c.id}/next{q}").url == f"/traces/{d.id}/{q}"
    assert operator_client.get(f"/traces/{c.id}/prev{q}").url == f"/traces/{a.id}/{q}"
    assert operator_client.get(f"/traces/{d.id}/next{q}").url == f"/traces/{q}"  # end: back to the list
    assert operator_client.get(f"/traces/{a.id}/next").url == f"/traces/{b.id}/"


def test_list_page_queries_are_pinned_and_do_not_grow_with_rows(
    operator_client, deployment, ingest, django_assert_num_queries
):
    ingest(deployment, *[simple(f"t{i}", "hello", i) for i in range(60)])
    trace_flag_set(trace=Trace.objects.first(), name="loop", source="rule")
    operator_client.get(LIST)  # warm the session
    # session, user, permissions (user + groups), page, flags, flag names, deployments, versions
    with django_assert_num_queries(9):
        assert len(listed(operator_client.get(LIST, {"deployment": deployment.id, "q": "hello"}))) == 50
    # An htmx "load more" (here past the end): session, user, permissions, page; no choice lists.
    with django_assert_num_queries(5):
        operator_client.get(LIST, {"after": "1790000000000000.1"}, HTTP_HX_REQUEST="true")


def test_detail_page_queries_are_pinned(operator_client, deployment, ingest, operator, django_assert_num_queries):
    (trace,) = ingest(deployment, {"external_id": "x", "tools": TOOLS, "messages": tool_conversation() * 10})
    for position in (4, 9, 14):
        comment_add(message=trace.messages.get(position=position), author=operator, body="hm")
    operator_client.get(f"/traces/{trace.id}/")
    # session, user, trace, permissions (2), messages, comments, corrections, ratings, feedback, flags,
    # its fork parent and forks, grades, judgements
    with django_assert_num_queries(14):
        assert operator_client.get(f"/traces/{trace.id}/").status_code == 200


def test_a_flag_filter_pages_and_navigates_in_list_order(operator_client, deployment, ingest):
    traces = ingest(
        deployment, *[simple(f"t{i:03d}", "hello", i // 2, environment="web" if i % 3 else "phone") for i in range(130)]
    )
    flagged = [t for i, t in enumerate(traces) if i % 10]  # 117 flagged traces
    for t in flagged:
        trace_flag_set(trace=t, name="loop", source="rule")
    expected = [t.external_id for t in sorted(flagged, key=lambda t: (t.started_at, t.id), reverse=True)]
    seen, url = [], LIST + "?flag=loop"
    while url:
        body = operator_client.get(url).content.decode()
        seen += re.findall(r'class="trace-link" href="[^"]+">([^<]+)</a>', body)
        # "Load more" names the list's own address (its page may answer a POST elsewhere).
        match = re.search(r'hx-get="(/traces/\?[^"]+)"', body)
        url = match.group(1).replace("&amp;", "&") if match else None
    assert seen == expected
    first, second = (next(t for t in flagged if t.external_id == e) for e in expected[:2])
    assert operator_client.get(f"/traces/{first.id}/next?flag=loop").url == f"/traces/{second.id}/?flag=loop"
    assert operator_client.get(f"/traces/{second.id}/prev?flag=loop").url == f"/traces/{first.id}/?flag=loop"


def test_a_long_trace_is_shown_a_page_of_messages_at_a_time(operator_client, deployment, ingest, operator):
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(450)]
    (trace,) = ingest(deployment, {"external_id": "long", "messages": messages})
    comment_add(message=trace.messages.get(position=401), author=operator, body="on the last page")

    first = operator_client.get(f"/traces/{trace.id}/").content.decode()
    assert len(re.findall(r'<article class="msg ', first)) == 200
    assert 'id="msg-0"' in first and 'id="msg-199"' in first and 'id="msg-200"' not in first
    assert "page 1 of 3" in first and 'href="?page=3"' in first

    last = operator_client.get(f"/traces/{trace.id}/?page=3").content.decode()
    assert len(re.findall(r'<article class="msg ', last)) == 50
    assert 'id="msg-400"' in last and 'id="msg-449"' in last and "on the last page" in last
    # Out of range or not a number: the nearest page, never an error.
    assert 'id="msg-449"' in operator_client.get(f"/traces/{trace.id}/?page=99").content.decode()
    assert 'id="msg-0"' in operator_client.get(f"/traces/{trace.id}/?page=x").content.decode()
