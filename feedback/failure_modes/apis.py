"""Failure modes over the API: a cluster as an annotation queue
(`POST /api/v1/failure-modes/clusters/<id>/queue`). Its evaluation slice is the training
sets' API (`training.apis_sets.FailureClusterSliceApi`), next to this one's URL.

For a person (a login session, or HTTP Basic with one's own login) who may see the
failure-modes page and build queues, as the page's button asks; not for a deployment's key.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404
from django.urls import reverse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from feedback.failure_modes.selectors import failure_cluster_get
from feedback.models import AnnotationQueue, FailureCluster
from feedback.permissions import BROWSE, BUILD_QUEUE
from feedback.services.queues import queue_from_failure_cluster
from webapp.kernel.auth import ThrottledBasicAuthentication
from webapp.kernel.errors import Invalid
from webapp.kernel.ids import parse_id


def may(*permissions: str) -> type[BasePermission]:
    class HasPermissions(BasePermission):
        message = f"your role does not include {' and '.join(permissions)}"

        def has_permission(self, request, view) -> bool:
            user = request.user
            return bool(user and user.is_authenticated and all(user.has_perm(p) for p in permissions))

    return HasPermissions


def failure_cluster_for(cluster_id: str) -> FailureCluster:
    """The cluster a URL names; `Invalid` (400) for what is no id, 404 for none."""
    pk = parse_id(cluster_id)
    if pk is None:
        raise Invalid("a failure mode's id (a whole number)", field="cluster")
    cluster = failure_cluster_get(cluster_id=pk)
    if cluster is None:
        raise Http404("no such failure mode")
    return cluster


def cluster_as_dict(cluster: FailureCluster) -> dict[str, Any]:
    return {
        "id": cluster.pk,
        "run": cluster.run_id,
        "name": cluster.name,
        "flag": cluster.flag_name,
        "traces": cluster.trace_count,
        "notes": cluster.size,
    }


def queue_as_dict(queue: AnnotationQueue, request) -> dict[str, Any]:
    return {
        "id": queue.pk,
        "name": queue.name,
        "description": queue.description,
        "item_count": queue.item_count,
        "failure_cluster": queue.failure_cluster_id,
        "url": request.build_absolute_uri(reverse("feedback:queue-detail", kwargs={"queue_id": queue.pk})),
        "created_by": queue.created_by.username if queue.created_by_id else None,
        "created_at": queue.created_at.isoformat(),
    }


def made_from_failure_mode_responses(key: str) -> dict[int, OpenApiResponse]:
    """The answers of an endpoint that makes one thing (its body's `key`) from a failure mode,
    once: the queue's and the evaluation slice's."""
    noun = key.replace("_", " ")
    return {
        201: OpenApiResponse(description=f"{{'created': true, '{key}', 'failure_mode'}}"),
        200: OpenApiResponse(description=f"the failure mode's {noun}, already made"),
        400: OpenApiResponse(
            description="`cluster`: the id is not a whole number, or the failure mode was dismissed, replaced "
            "by a restart of its run, or has nothing to use; nothing is stored"
        ),
        403: OpenApiResponse(description="not a person with these permissions (an API key is refused)"),
        404: OpenApiResponse(description="no such failure mode"),
    }


class FailureClusterQueueApi(APIView):
    """POST: the failure mode's traces as an annotation queue (201), or the queue already made
    for it (200, `"created": false`)."""

    authentication_classes = [SessionAuthentication, ThrottledBasicAuthentication]
    permission_classes = [IsAuthenticated, may(BROWSE, BUILD_QUEUE)]

    @extend_schema(
        request=None,
        responses=made_from_failure_mode_responses("queue"),
    )
    def post(self, request, cluster_id: str):
        cluster = failure_cluster_for(cluster_id)
        queue, created = queue_from_failure_cluster(cluster=cluster, created_by=request.user)
        body = {"created": created, "queue": queue_as_dict(queue, request), "failure_mode": cluster_as_dict(cluster)}
        return Response(body, status=201 if created else 200)
