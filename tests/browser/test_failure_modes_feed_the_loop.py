"""On the failure-modes page an operator turns a failure mode into an annotation queue and an
evaluation slice, one click each, lands on what was made, and follows its link back."""

from __future__ import annotations

import re

import pytest

from feedback.failure_modes.services import failure_cluster_rename
from feedback.models import AnnotationQueue
from tests.factories import user_with_role
from tests.failure_modes.test_cluster_names_and_flags import noted  # noqa: F401
from tests.failure_modes.test_feed_the_loop import HOSTILE, modes  # noqa: F401
from training.models import TrainingSet

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_failure_mode_becomes_a_queue_and_an_evaluation_slice(open_page, modes, screenshot):  # noqa: F811
    cluster = modes["tracking"]
    dialogs: list[str] = []
    # The page's CSP off: only the escaping keeps a hostile name text (below).
    page = open_page(user_with_role("operator", "olga"), bypass_csp=True)
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.goto("/failure-modes/")
    card = page.locator(f"#cluster-{cluster.pk}")

    card.locator("button:has-text('Review in a queue')").click()
    page.wait_for_url(re.compile(r"/queues/\d+/$"))
    queue = AnnotationQueue.objects.get()
    assert page.url.endswith(f"/queues/{queue.pk}/")
    assert page.locator("h1").inner_text() == "Failure mode: Missing tracking link"
    assert page.locator("#queue-items tbody tr").count() == 4
    assert "holds the failure mode's 4 traces" in page.locator(".flash").inner_text()
    page.locator("#queue-source a").click()  # back to the failure mode it came from
    page.wait_for_url(re.compile(rf"/failure-modes/\?run={modes['run'].pk}#cluster-{cluster.pk}$"))
    card = page.locator(f"#cluster-{cluster.pk}")
    assert card.locator("a.button").inner_text() == "Open its queue"
    screenshot(page, "failure-mode-to-the-loop", element=card)

    card.locator("button:has-text('Make an evaluation slice')").click()
    page.wait_for_url(re.compile(r"/training/sets/\d+/$"))
    built = TrainingSet.objects.get()
    assert page.url.endswith(f"/training/sets/{built.pk}/")
    assert page.locator("#set-source a").inner_text() == "Missing tracking link"
    assert page.locator("#set-items tbody tr[data-split=heldout]").count() == 4
    assert page.locator("#set-items tbody tr[data-split=train]").count() == 0
    screenshot(page, "failure-mode-evaluation-slice")
    page.locator("a:has-text('Evaluate a candidate on it')").click()
    page.wait_for_url(re.compile(r"/models/"))
    assert page.locator("select[name=training_set]").input_value() == str(built.pk)

    failure_cluster_rename(cluster=cluster, name=HOSTILE)
    for path, where in (
        (f"/training/sets/{built.pk}/", "#set-source a"),
        (f"/queues/{queue.pk}/", "#queue-source a"),
        ("/failure-modes/", f"#cluster-{cluster.pk} h3 a"),
    ):
        page.goto(path)
        assert page.locator(where).inner_text() == HOSTILE, path
    assert dialogs == []
