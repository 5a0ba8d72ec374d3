"""A gateway trace's duration and the latency timeline of its turns."""

from __future__ import annotations

import dataclasses

import pytest

from feedback.models import Trace
from feedback.selectors.review import trace_review
from feedback.services.capture import TraceDigestCache, exchanges_record
from tests.factories import DeploymentFactory, user_with_role
from tests.feedback.test_capture import answer, exchange

pytestmark = pytest.mark.django_db


def test_a_gateway_trace_lasts_from_its_first_request_to_its_last_answer():
    deployment = DeploymentFactory()
    u1 = {"role": "user", "content": "hi"}
    first = dataclasses.replace(
        exchange(deployment, [u1], response=answer("hello")), started_at=1_800_000_000.0, latency_ms=500.0
    )
    echoed = {"role": "assistant", "content": "hello"}
    second = dataclasses.replace(
        exchange(deployment, [u1, echoed, {"role": "user", "content": "more"}], response=answer("sure")),
        started_at=1_800_000_002.0,
        latency_ms=1500.0,
    )
    exchanges_record(exchanges=[first], cache=TraceDigestCache())
    exchanges_record(exchanges=[second], cache=TraceDigestCache())
    trace = Trace.objects.get()
    assert (trace.ended_at - trace.started_at).total_seconds() == pytest.approx(3.5)

    review = trace_review(trace=trace, user=user_with_role("operator"))
    assert review.duration_s == pytest.approx(3.5)
    bars = [(b.position, b.start_ms, b.latency_ms, b.left_pct) for b in review.timeline]
    assert bars == [(1, pytest.approx(0.0), 500.0, 0.0), (3, pytest.approx(2000.0, abs=0.01), 1500.0, 57.14)]

    # A gateway trace stored before its end was recorded still gets a duration from its turns.
    Trace.objects.filter(pk=trace.pk).update(ended_at=None)
    trace.refresh_from_db()
    assert trace_review(trace=trace, user=user_with_role("operator")).duration_s == pytest.approx(3.5)
