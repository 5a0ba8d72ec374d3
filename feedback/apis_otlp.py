"""OTLP/HTTP trace receiver: `POST /api/v1/otel/v1/traces`, what an OpenTelemetry exporter
sends to `OTEL_EXPORTER_OTLP_ENDPOINT=…/api/v1/otel` (see feedback/services/otlp.py)."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.views import APIView

from feedback.auth import ApiKeyPrincipal, scope_required
from feedback.models import ApiKeyScope
from feedback.services.otlp import OtlpError, export_response, otlp_decode
from feedback.services.otlp_ingest import otlp_ingest
from webapp.kernel.api_errors import error_response


class OtlpTracesApi(APIView):
    """Receive an OTLP trace export (protobuf or JSON, optionally gzip) with an ingest key.
    Answers 200 with an ExportTraceServiceResponse in the request's encoding; its
    `partialSuccess` counts the rejected spans and says why, per trace."""

    permission_classes = [scope_required(ApiKeyScope.INGEST)]
    parser_classes: list = []  # the body is decoded here, after the size check

    @extend_schema(
        request={"application/x-protobuf": bytes, "application/json": dict},
        responses={
            200: OpenApiResponse(description="ExportTraceServiceResponse; partialSuccess names rejected spans."),
            400: OpenApiResponse(description="Not an OTLP export request (field and reason)."),
            403: OpenApiResponse(description="Not an API key with the ingest scope."),
            413: OpenApiResponse(description="Body larger than the ingest limit."),
        },
    )
    def post(self, request):
        if not isinstance(request.user, ApiKeyPrincipal):
            return error_response(
                403, "Authorization", "an OTLP export is stored for the deployment of its ingest API key; send one"
            )
        limit = settings.INGEST_MAX_BODY_BYTES
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        if length > limit:
            return error_response(413, "body", f"{length} bytes; at most {limit} bytes per request")
        try:
            body = request._request.body
        except RequestDataTooBig:
            return error_response(413, "body", f"{length} bytes; at most {limit} bytes per request")
        try:
            export, as_json = otlp_decode(
                body,
                content_type=request.META.get("CONTENT_TYPE", ""),
                content_encoding=request.META.get("HTTP_CONTENT_ENCODING", ""),
                max_bytes=limit,
            )
            result = otlp_ingest(deployment=request.user.deployment, request=export)
        except OtlpError as exc:
            status = 415 if exc.field == "Content-Type" else 400
            return error_response(status, exc.field, exc.reason)
        content, content_type = export_response(
            rejected=result.rejected_spans, message=result.error_message, as_json=as_json
        )
        return HttpResponse(content, content_type=content_type, status=200)
