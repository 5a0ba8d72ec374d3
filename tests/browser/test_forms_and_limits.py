"""Forms keep what was typed when they show an error, with the error beside its field in
words the reader understands, scrolled into view; free-text fields state their limits and
long text wraps instead of widening the page."""

from __future__ import annotations

import pytest

from feedback.models import CustomerFeedback, Trace
from feedback.services.customer_feedback import FeedbackTarget, feedback_link_create
from feedback.services.ingest import traces_ingest
from feedback.services.review import comment_add
from tests.factories import user_with_role
from tests.feedback.conftest import TOOLS, tool_conversation
from training.serving.services import deployment_get_or_create

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

IN_VIEW = "e => { const r = e.getBoundingClientRect(); return r.top >= 0 && r.bottom <= window.innerHeight; }"


def one_trace(**extra) -> Trace:
    deployment = deployment_get_or_create(name="support-bot")
    traces_ingest(
        deployment=deployment,
        items=[{"external_id": "c", "tools": TOOLS, "messages": tool_conversation(), **extra}],
    )
    return Trace.objects.get()


def test_the_public_feedback_form_keeps_input_and_says_what_is_wrong_in_plain_words(open_page):
    trace = one_trace()
    token, _ = feedback_link_create(target=FeedbackTarget(trace, None), customer_ref="cust-1")
    page = open_page(height=420)
    page.goto(f"/f/{token}")
    assert page.locator("label:has-text('Comment') .hint").inner_text() == "(up to 20000 characters)"

    page.click("button:has-text('Send feedback')")
    error = page.locator(".field-error")
    assert error.inner_text() == "Please choose Helpful or Not helpful, or write a comment, before sending."
    # Beside the rating it is about: the next thing after the rating's fieldset.
    assert page.evaluate("document.querySelector('fieldset.choices').nextElementSibling.className").startswith("error")

    page.check("input[value=down]")
    page.eval_on_selector("textarea[name=correction]", "t => { t.value = 'Say when it ships.'; }")
    # A comment longer than the limit (pasted past the box's own limit by a script).
    page.eval_on_selector("textarea[name=comment]", "t => { t.value = 'x'.repeat(20001); }")
    page.click("button:has-text('Send feedback')")
    error = page.locator("textarea[name=comment] + .field-error, label:has(textarea[name=comment]) + .field-error")
    assert error.inner_text() == "Your comment is 20001 characters long; please shorten it to 20,000 or fewer."
    assert "at most" not in error.inner_text() and "characters;" not in error.inner_text()
    assert error.evaluate(IN_VIEW)
    assert page.is_checked("input[value=down]")
    assert page.input_value("textarea[name=correction]") == "Say when it ships."
    assert len(page.input_value("textarea[name=comment]")) == 20001
    assert CustomerFeedback.objects.count() == 0

    page.fill("textarea[name=comment]", "Too slow.")
    page.click("button:has-text('Send feedback')")
    page.locator("h1:has-text('Thank you')").wait_for()
    assert CustomerFeedback.objects.get().correction == "Say when it ships."


def test_free_text_fields_state_their_limits_and_long_text_wraps(open_page):
    long_word = "A" * 3000
    trace = one_trace(metadata={"note": long_word})
    operator = user_with_role("operator", "olga")
    comment_add(message=trace.messages.get(position=4), author=operator, body=long_word)
    page = open_page(operator, width=1280)
    page.goto(f"/traces/{trace.pk}/")
    page.click("#comments-4 summary:has-text('Comment')")
    assert "At most 20000 characters" in page.locator("#comments-4 .comment-new .hint").inner_text()
    assert page.locator("#comments-4 .comment-new textarea[name=body]").get_attribute("maxlength") == "20000"
    page.click("#corrections-4 a:has-text('Write a correction')")
    form = page.locator("#corrections-4 .correction-form")
    form.wait_for()
    assert "at most 100000 characters" in form.inner_text() and "at most 20000 characters" in form.inner_text()
    # A 3,000-character word in a comment and in the metadata wraps: the page does not widen.
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280


def test_a_refused_comment_keeps_its_text_and_quote_with_the_error_beside_the_box(open_page):
    trace = one_trace()
    page = open_page(user_with_role("operator", "olga"))
    page.goto(f"/traces/{trace.pk}/")
    page.evaluate(
        """() => { const node = document.querySelector('#text-4').firstChild;
                   const range = document.createRange(); range.setStart(node, 7); range.setEnd(node, 14);
                   const sel = window.getSelection(); sel.removeAllRanges(); sel.addRange(range); }"""
    )
    page.keyboard.press("c")
    box = page.locator("#comments-4 .comment-new textarea[name=body]")
    box.wait_for(state="visible")
    # Longer than the limit (a script gets past the box's own maxlength, as a paste tool might).
    box.evaluate("t => { t.value = 'Too long. '.repeat(2001); }")
    page.keyboard.press("Control+Enter")
    error = page.locator("#comments-4 .comment-new .field-error")
    error.wait_for()
    assert "at most 20000" in error.inner_text()
    kept = page.locator("#comments-4 .comment-new textarea[name=body]")
    assert len(kept.input_value()) == 20010 and kept.get_attribute("aria-invalid") == "true"
    assert page.locator("#comments-4 .quote-preview").inner_text() == "shipped"
    # The cursor is back in the box: htmx moves it once the swap settles (`htmx:afterSettle`,
    # after its settle delay), a moment after the error is in the page. Polled from here:
    # the page's CSP refuses the string a `wait_for_function` would evaluate.
    for _ in range(50):
        if page.evaluate("document.activeElement.name") == "body":
            break
        page.wait_for_timeout(100)
    assert page.evaluate("document.activeElement.name") == "body"
