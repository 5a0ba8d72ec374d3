"""The review dashboard in real headless Chromium: what an operator and a reviewer do."""

from __future__ import annotations

import re

import pytest

from feedback.models import Comment, Correction, QueueItem, Trace, TurnRating
from feedback.services.flags import trace_flag_set
from feedback.services.ingest import traces_ingest
from feedback.services.search import traces_search_index
from tests.factories import user_with_role
from tests.feedback.conftest import TOOLS, tool_conversation
from training.serving.services import deployment_get_or_create

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def seed():
    deployment = deployment_get_or_create(name="support-bot")
    items = [
        {
            "external_id": f"conv-{i}",
            "environment": env,
            "started_at": f"2026-11-2{i}T10:00:00Z",
            "tools": TOOLS,
            "messages": tool_conversation(question, "It has shipped."),
        }
        for i, (env, question) in enumerate(
            [
                ("phone", "My kettle is broken"),
                ("web", "Where is my blender order A1?"),
                ("web", "Has my toaster shipped?"),
                ("web", "Where is my blender parcel?"),
            ]
        )
    ]
    results = traces_ingest(deployment=deployment, items=items)
    traces_search_index(trace_ids=[r.trace_id for r in results])  # what the worker does after commit
    return {r.external_id: r.trace_id for r in results}


def rows(page) -> list[str]:
    return page.locator("a.trace-link").all_inner_texts()


def test_operator_filters_opens_navigates_comments_rates_and_corrects(open_page, screenshot):
    ids = seed()
    user_with_role("operator", "olga").set_password("pw-for-tests-1")
    page = open_page()
    page.goto("/traces/")
    assert "/login/" in page.url
    page.fill("#id_username", "olga")
    page.fill("#id_password", "pw-for-tests-1")
    page.click("button:has-text('Log in')")
    page.wait_for_url(re.compile(r"/traces/$"))
    assert rows(page) == ["conv-3", "conv-2", "conv-1", "conv-0"]

    # Filters update the results in place and the address bar keeps them.
    page.fill("input[name=environment]", "web")
    page.press("input[name=environment]", "Enter")
    page.wait_for_url(re.compile(r"environment=web"))
    page.wait_for_function("document.querySelectorAll('a.trace-link').length === 3")
    page.fill("#id_q", "blender")
    page.wait_for_url(re.compile(r"q=blender"))
    page.wait_for_function("document.querySelectorAll('a.trace-link').length === 2")
    assert rows(page) == ["conv-3", "conv-1"]
    assert "q=blender" in page.url and "environment=web" in page.url and "deployment=" not in page.url
    # The back button restores the previous filter.
    page.go_back()
    page.wait_for_function("document.querySelectorAll('a.trace-link').length === 3")

    page.goto("/traces/?environment=web&q=blender")
    page.click("text=conv-3")
    page.wait_for_url(re.compile(rf"/traces/{ids['conv-3']}/\?"))
    page.keyboard.press("j")
    page.wait_for_url(re.compile(rf"/traces/{ids['conv-1']}/\?q=blender&environment=web$"))
    page.keyboard.press("k")
    page.wait_for_url(re.compile(rf"/traces/{ids['conv-3']}/\?"))

    # Select "shipped" in the final answer and press c: the comment box opens with the quote.
    page.evaluate(
        """() => { const node = document.querySelector('#text-4').firstChild;
                   const range = document.createRange(); range.setStart(node, 7); range.setEnd(node, 14);
                   const sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(range); }"""
    )
    page.keyboard.press("c")
    box = page.locator("#comments-4 textarea[name=body]")
    box.wait_for(state="visible")
    assert page.locator("#comments-4 .quote-preview").inner_text() == "shipped"
    box.fill("Should have included the <b>tracking link</b>.")
    page.click("#comments-4 button:has-text('Add comment')")
    page.locator("#comments-4 .comment-body").wait_for()
    assert page.locator("#comments-4 .comment-body").inner_text() == "Should have included the <b>tracking link</b>."
    comment = Comment.objects.get()
    assert (comment.quote, comment.quote_start, comment.quote_end) == ("shipped", 7, 14)

    page.click("#rating-4 button[value=down]")
    page.locator("#rating-4 button.thumb.active").wait_for()
    assert TurnRating.objects.get().value == -1
    screenshot(page, "trace-detail", full_page=True)

    # The correction editor opens inline under the turn: a tool call checked against the tool's schema.
    before = page.url
    page.click("#corrections-2 a:has-text('Write a correction')")
    editor = page.locator("#corrections-2 .correction-form")
    editor.wait_for()
    assert page.url == before
    editor.locator(".tool-row select[name=tool_name]").select_option("refund")
    editor.locator(".tool-row textarea[name=tool_args]").fill('{"order_id": "A1"}')
    editor.locator("textarea[name=content]").fill("I have refunded order A1.")
    page.evaluate("window.scrollTo(0, 0)")
    editor.locator("button:has-text('Save correction')").click()
    error = page.locator("#corrections-2 .tool-row .field-error")
    error.wait_for()
    assert "'amount' is a required property" in error.inner_text()
    # What was typed is kept, the error sits beside its field, scrolled into view.
    assert editor.locator("textarea[name=content]").input_value() == "I have refunded order A1."
    assert editor.locator(".tool-row textarea[name=tool_args]").input_value() == '{"order_id": "A1"}'
    page.wait_for_function(
        "() => { const r = document.querySelector('#corrections-2 .field-error').getBoundingClientRect();"
        " return r.top >= 0 && r.bottom <= window.innerHeight; }"
    )
    editor.locator(".tool-row textarea[name=tool_args]").fill('{"order_id": "A1", "amount": 20}')
    editor.locator("button:has-text('Save correction')").click()
    page.locator("#corrections-2 .correction").wait_for()
    assert page.locator("#corrections-2 .correction-form").count() == 0 and page.url == before
    assert "I have refunded order A1." in page.locator("#corrections-2").inner_text()
    assert Correction.objects.get().tool_calls[0]["function"]["name"] == "refund"

    trace_flag_set(trace=Trace.objects.get(pk=ids["conv-1"]), name="wrong-tool", source="judge")
    Trace.objects.filter(pk=ids["conv-2"]).update(judge_reward=0.25, has_customer_feedback=True, feedback_rating=-1)
    page.goto("/traces/")
    page.locator("tr.trace-row").first.wait_for()
    screenshot(page, "trace-list")


def test_hostile_trace_content_renders_as_text_and_no_script_runs(open_page):
    deployment = deployment_get_or_create(name="support-bot")
    evil = (
        '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'
        '<a href="javascript:window.__pwned=3">click me</a> [md](javascript:window.__pwned=4)'
    )
    huge = "0123456789 " * 100_000  # 1.1 MB
    (result,) = traces_ingest(
        deployment=deployment,
        items=[
            {
                "external_id": '<img src=x onerror="window.__pwned=5">',
                "metadata": {"note": evil},
                "tools": [{"type": "function", "function": {"name": "lookup", "description": evil}}],
                "messages": [
                    {"role": "user", "content": evil},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "function": {
                                    "name": "lookup",
                                    "arguments": '{"q": "</pre><script>window.__pwned=6</script>"}',
                                },
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "c1", "content": huge},
                    {"role": "assistant", "content": evil},
                ],
            }
        ],
    )
    # The policy would block inline scripts anyway; switch it off so escaping alone is tested.
    page = open_page(user_with_role("operator", "olga"), bypass_csp=True)
    dialogs = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    for url in ("/traces/", f"/traces/{result.trace_id}/"):
        page.goto(url)
        page.wait_for_load_state("load")
        assert page.evaluate("window.__pwned") is None
    assert page.locator("#text-0").inner_text() == evil
    assert page.locator("img").count() == 0
    assert page.locator("a[href^='javascript']").count() == 0
    assert page.locator("script:not([src])").count() == 0
    # The 1 MB tool result is cut, loads in full on demand, and the page still responds.
    assert len(page.locator("#text-2").inner_text()) == 2000
    page.click("#body-2 a.show-more")
    page.wait_for_function("document.querySelector('#text-2').textContent.length > 1000000")
    page.keyboard.press("c")
    page.locator("#comments-3 textarea[name=body]").wait_for(state="visible")
    assert page.evaluate("window.__pwned") is None and not dialogs


def test_reviewer_works_through_a_queue_built_from_a_filter(open_page):
    seed()
    operator = user_with_role("operator", "olga")
    page = open_page(operator)
    page.goto("/traces/?environment=web")
    page.click("summary:has-text('Build an annotation queue')")
    page.fill("#queue-form input[name=name]", "web chats")
    page.click("#queue-form button:has-text('Create queue')")
    page.wait_for_url(re.compile(r"/queues/\d+/$"))
    assert "3 traces" in page.locator(".flash").inner_text()

    reviewer = user_with_role("reviewer", "rita")
    page = open_page(reviewer)
    page.goto("/")
    page.click("a:has-text('web chats')")
    page.click("#queue-next")
    page.wait_for_url(re.compile(r"/queues/\d+/items/\d+/$"))
    first = page.url
    assert "item 1 of 3" in page.locator("#queue-bar").inner_text()
    page.keyboard.press("d")
    page.wait_for_url(lambda url: url != first and "/items/" in url)
    assert "item 2 of 3" in page.locator("#queue-bar").inner_text()
    second = page.url
    page.keyboard.press("s")
    page.wait_for_url(lambda url: url != second and "/items/" in url)
    page.keyboard.press("d")
    page.wait_for_url(re.compile(r"/queues/\d+/$"))
    assert "2 of 3 done" in page.locator(".progress-line").inner_text()
    assert "rita" in page.locator("table.reviewers").inner_text()
    assert QueueItem.objects.filter(status="done", done_by=reviewer).count() == 2
