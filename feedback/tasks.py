"""Celery tasks of the feedback app: shells around one service each."""

from __future__ import annotations

from celery import shared_task

from feedback.services.search import traces_search_index


@shared_task(name="feedback.search_index", queue="default", ignore_result=True)
def search_index(trace_ids: list[int]) -> int:
    """Build the search vectors of freshly stored traces (idempotent: a rerun rewrites them)."""
    return traces_search_index(trace_ids=trace_ids)
