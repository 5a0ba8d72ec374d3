"""A form that comes back with errors keeps what was typed, sums the errors up at its top in
the words of its labels, and puts the cursor in the first field in error: a person who
submitted a form far down a page is not left at the top of it."""

from __future__ import annotations

import pytest

from tests.factories import user_with_role
from training.models import TrainingSet

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Within a pixel: scrolling an element to the top can leave it a fraction of a pixel above it.
IN_VIEW = "e => { const r = e.getBoundingClientRect(); return r.top >= -1 && r.bottom <= window.innerHeight + 1; }"


def test_a_refused_build_keeps_its_values_and_focuses_the_first_error(open_page):
    page = open_page(user_with_role("operator", "olga"), height=700)
    page.goto("/training/jobs/")
    form = page.locator("#set-form")
    form.locator("input[name=name]").fill("my set")
    form.locator("input[name=heldout_fraction]").fill("1.5")
    form.locator("input[name=filters]").fill("comment=yes")
    form.locator("button:has-text('Build')").click()

    summary = page.locator("#set-errors")
    summary.wait_for()
    page.wait_for_load_state("load")  # forms.js runs once the document is parsed
    assert summary.evaluate(IN_VIEW), "the errors landed out of view"
    text = summary.inner_text()
    assert "Name: use letters" in text and "Held-out fraction: must be a number" in text
    assert "heldout_fraction" not in text
    # The cursor is in the first field in error; every value is as it was typed.
    assert page.evaluate("document.activeElement.id") == "set-name"
    assert form.locator("input[name=heldout_fraction]").input_value() == "1.5"
    assert form.locator("input[name=filters]").input_value() == "comment=yes"

    summary.locator("a:has-text('Held-out fraction')").click()
    assert page.evaluate("document.activeElement.id") == "set-heldout-fraction"
    assert not TrainingSet.objects.exists()
