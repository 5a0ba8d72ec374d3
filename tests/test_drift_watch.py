"""Drift watch: the live version's first outcomes against its latest, on the overview."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from feedback.models import CustomerFeedback, Grade
from tests.factories import DeploymentFactory, TraceFactory, user_with_role
from training.serving.models import BaseModel, ModelVersion
from webapp.site.selectors_drift import live_drift, rate_drop

pytestmark = pytest.mark.django_db


def test_rate_drop_by_hand():
    # first: 3 of 4 good = 0.75; latest: 1 of 4 = 0.25; drop 0.5
    assert rate_drop([1, 1, 1, 0], [0, 1, 0, 0]) == pytest.approx(0.5)
    assert rate_drop([0, 1], [1, 1]) == pytest.approx(-0.5)  # better recently: negative
    assert rate_drop([], [1]) is None


@pytest.fixture
def live(tmp_path):
    from training.serving.services import live_version_set

    deployment = DeploymentFactory(name="support-bot")
    base = BaseModel.objects.create(name="smol", path=str(tmp_path))
    old = ModelVersion.objects.create(name="smol-v0", base_model=base, kind="base", path=str(tmp_path))
    version = ModelVersion.objects.create(name="smol-v1", base_model=base, kind="lora", path=str(tmp_path))
    live_version_set(deployment=deployment, version=old)
    return deployment, old, version, live_version_set


def graded(deployment, version, outcomes, *, start):
    for i, ok in enumerate(outcomes):
        trace = TraceFactory(deployment=deployment, model_version=version)
        Grade.objects.create(
            deployment=deployment,
            trace=trace,
            outcome="success" if ok else "failure",
            source="support-desk",
            created_at=start + timedelta(minutes=i),
        )


def test_a_drop_past_the_threshold_flags_the_live_version_and_only_its_own_traffic_counts(live, client):
    deployment, old, version, live_version_set = live
    graded(deployment, old, [0] * 10, start=timezone.now() - timedelta(days=2))  # before the flip: not counted
    live_version_set(deployment=deployment, version=version)
    now = timezone.now()
    graded(deployment, version, [1, 1, 1, 1, 0, 1, 0, 0, 0, 0], start=now + timedelta(seconds=1))
    success, rating = live_drift(deployment=deployment, window=4, threshold=0.3)
    assert (success.baseline_rate, success.recent_rate, success.drop) == (1.0, 0.0, 1.0) and success.flagged
    assert not rating.flagged and rating.drop is None and rating.n == 0

    # A drop within the threshold, or too little traffic to compare, flags nothing.
    assert not live_drift(deployment=deployment, window=4, threshold=1.0)[0].flagged
    few = live_drift(deployment=deployment, window=6, threshold=0.1)[0]
    assert not few.flagged and few.detail == "10 of the 12 outcomes needed to compare"

    client.force_login(user_with_role("operator", "olga"))
    with override_settings(DRIFT_WINDOW=4, DRIFT_DROP=0.3):
        page = client.get("/overview/").content.decode()
    assert "drifting" in page and "first 4: 100%, latest 4: 0%" in page
    with override_settings(DRIFT_WINDOW=4, DRIFT_DROP=1.0):
        page = client.get("/overview/").content.decode()
    assert 'class="flag drift-flag"' not in page


def test_customer_ratings_count_unhappy_ones_and_leave_graded_outcomes_out(live):
    deployment, _old, version, live_version_set = live
    live_version_set(deployment=deployment, version=version)
    start = timezone.now() + timedelta(seconds=1)
    for i, (kind, rating) in enumerate(
        [("thumbs", 1), ("score", 4), ("score", 3), ("thumbs", -1), ("score", 2), ("thumbs", -1)]
    ):
        CustomerFeedback.objects.create(
            deployment=deployment,
            trace=TraceFactory(deployment=deployment, model_version=version),
            rating_kind=kind,
            rating=rating,
            created_at=start + timedelta(minutes=i),
        )
    graded(deployment, version, [1] * 6, start=start)
    _success, rating = live_drift(deployment=deployment, window=3, threshold=0.5)
    assert (rating.baseline_rate, rating.recent_rate) == (1.0, 0.0) and rating.flagged
