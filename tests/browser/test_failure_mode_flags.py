"""On the failure-modes page a person renames a failure mode (its flag follows) or dismisses
it, in place."""

from __future__ import annotations

import pytest

from feedback.failure_modes.services import failure_mode_run_execute
from feedback.models import FailureCluster, FailureModeRun, TraceFlag
from tests.factories import user_with_role
from tests.failure_modes.test_cluster_names_and_flags import embed, noted  # noqa: F401
from tests.fixtures.judge import Reply

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_failure_mode_is_renamed_and_dismissed_on_its_page(open_page, noted, judge_server, screenshot):  # noqa: F811
    judge_server.respond_with(lambda request: Reply.json({"name": "Cluster 1", "description": "Notes."}))
    run = FailureModeRun.objects.create(deployment=noted, max_traces=100)
    failure_mode_run_execute(run=run, endpoint=judge_server.endpoint(), embed=embed)
    (cluster,) = FailureCluster.objects.all()
    page = open_page(user_with_role("operator", "otto"))
    page.goto("/failure-modes/")
    article = page.locator(f"#cluster-{cluster.pk}")
    # "Cluster 1" is no name: the cluster is named after its most representative comment.
    assert "named from its most representative comment" in article.inner_text()
    assert "tracking link" in article.locator("h3 a").inner_text().lower()

    article.locator("summary:has-text('Rename')").click()
    article.locator("input[name=name]").fill("   ")
    article.locator("button:has-text('Save name')").click()
    article.locator(".field-error").wait_for()
    assert "required" in article.locator(".field-error").inner_text()
    article.locator("input[name=name]").fill("No parcel tracking")
    article.locator("button:has-text('Save name')").click()
    article.locator("h3 a:has-text('No parcel tracking')").wait_for()
    assert article.locator("h3 a").get_attribute("href") == "/traces/?flag=mode-no-parcel-tracking"
    assert TraceFlag.objects.filter(name="mode-no-parcel-tracking").count() == 4
    page.reload()  # the flag table counts the renamed flag too
    assert "mode-no-parcel-tracking" in page.locator("table.flag-counts").inner_text()
    screenshot(page, "failure-modes")
    article = page.locator(f"#cluster-{cluster.pk}")

    page.on("dialog", lambda dialog: dialog.accept())
    article.locator("button:has-text('Dismiss')").click()
    article.locator("h3 s").wait_for()
    assert "dismissed by otto" in article.inner_text()
    assert not TraceFlag.objects.filter(source="cluster").exists()
