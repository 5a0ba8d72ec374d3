"""The trace API: batch ingest and read."""

from __future__ import annotations

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from feedback.auth import scope_required
from feedback.models import ApiKeyScope, TraceSource
from feedback.selectors import trace_as_dict, trace_visible_to
from feedback.services.ingest import traces_ingest
from webapp.api_errors import error_response

_message_schema = inline_serializer(
    "ChatMessage",
    many=True,
    fields={
        "role": serializers.ChoiceField(["system", "user", "assistant", "tool"]),
        "content": serializers.JSONField(
            help_text="A string, an array of content parts, or null (an assistant turn with tool calls)."
        ),
        "tool_calls": serializers.JSONField(required=False),
        "tool_call_id": serializers.CharField(required=False),
        "name": serializers.CharField(required=False),
    },
)
_trace_schema = inline_serializer(
    "TraceIn",
    many=True,
    fields={
        "external_id": serializers.CharField(max_length=200),
        "messages": _message_schema,
        "tools": serializers.JSONField(required=False),
        "session_id": serializers.CharField(required=False),
        "environment": serializers.CharField(required=False),
        "model": serializers.CharField(required=False),
        "metadata": serializers.JSONField(required=False),
        "status": serializers.ChoiceField(["ok", "error", "in_progress"], required=False),
        "started_at": serializers.DateTimeField(required=False),
        "ended_at": serializers.DateTimeField(required=False),
    },
)


class TraceIngestApi(APIView):
    """Store a batch of traces. Answers 207 with one result per item."""

    permission_classes = [scope_required(ApiKeyScope.INGEST)]
    parser_classes: list = []  # the body is parsed here, after the size check

    @extend_schema(
        request=inline_serializer("TraceBatch", {"traces": _trace_schema}),
        responses={
            207: OpenApiResponse(
                description="Per-item results: created, exists, appended or error (with field and reason)."
            ),
            400: OpenApiResponse(description="The body is not a JSON object with a 'traces' array."),
            413: OpenApiResponse(description="Body or batch larger than the limits."),
        },
    )
    def post(self, request):
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > settings.INGEST_MAX_BODY_BYTES:
            return self._too_large(length)
        try:
            body = request._request.body
        except RequestDataTooBig:
            return self._too_large(length)
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return error_response(400, "body", f"not valid JSON: {exc}")
        if not isinstance(data, dict) or not isinstance(data.get("traces"), list):
            return error_response(400, "traces", "the body must be an object with a 'traces' array")
        items = data["traces"]
        if len(items) > settings.INGEST_MAX_TRACES_PER_BATCH:
            return error_response(
                413, "traces", f"{len(items)} traces; at most {settings.INGEST_MAX_TRACES_PER_BATCH} per batch"
            )
        results = traces_ingest(deployment=request.user.deployment, items=items, source=TraceSource.INGEST)
        summary = {s: 0 for s in ("created", "exists", "appended", "error")}
        for r in results:
            summary[r.status] += 1
        return Response({"results": [r.as_dict() for r in results], **summary}, status=status.HTTP_207_MULTI_STATUS)

    @staticmethod
    def _too_large(length: int) -> Response:
        return error_response(
            413, "body", f"{length} bytes; at most {settings.INGEST_MAX_BODY_BYTES} bytes per request"
        )


class TraceDetailApi(APIView):
    permission_classes = [scope_required(ApiKeyScope.READ)]

    @extend_schema(responses={200: OpenApiResponse(description="The trace with its messages.")})
    def get(self, request, trace_id: int):
        trace = get_object_or_404(trace_visible_to(request.user), pk=trace_id)
        return Response(trace_as_dict(trace))
