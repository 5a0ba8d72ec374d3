"""An evaluation of a tool-calling candidate in Chromium, graded right on both outcomes: the
tiny model's adapter calls lookup_order on A1001 everywhere, which is wrong where a reply is
wanted and right where the look-up is; the report and the item pages say so."""

from __future__ import annotations

import pytest

from tests.factories import user_with_role
from tests.promotion.test_evaluation import TOOL_GRADED, local_registry  # noqa: F401 - the fixture
from webapp.kernel.work import WorkStatus

pytestmark = [pytest.mark.browser, pytest.mark.postgres]


def test_the_report_grades_a_served_tool_call_as_the_call_it_was(open_page, local_registry):  # noqa: F811
    from training.promotion.services.evaluation import evaluation_create, evaluation_run

    operator = user_with_role("operator", "olga")
    deployment, _, candidate = local_registry
    evaluation = evaluation_create(
        candidate=candidate, deployment=deployment, items=TOOL_GRADED, created_by=operator, max_tokens=40
    )
    evaluation = evaluation_run(evaluation_id=evaluation.pk)
    assert evaluation.status == WorkStatus.FINISHED, evaluation.error

    page = open_page(operator)
    page.goto(f"/evaluations/{evaluation.pk}/")
    rows = {
        row.locator("td.preview").inner_text(): [c.inner_text() for c in row.locator("td").all()]
        for row in page.locator("table.items tbody tr").all()
    }
    # Columns: #, item, outcome, reward, graded (candidate / live), …
    assert rows["should-reply"][2:5:2] == ["Tie", "0 / 0"]
    assert rows["should-look-up"][2:5:2] == ["Candidate better", "1 / 0"]
    page.click("a:has-text('should-look-up')")
    assert "lookup_order" in page.inner_text("#candidate-response")
    assert "1" in page.locator("#candidate-response dd").nth(1).inner_text()
