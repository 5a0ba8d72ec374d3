"""The trace API: batch ingest and read."""

from __future__ import annotations

from datetime import timedelta

import orjson
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import FileResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import SAFE_METHODS, AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from feedback.auth import ApiKeyPrincipal, scope_required
from feedback.forms import trace_filters
from feedback.models import ApiKeyScope, FeedbackSource, TraceSource
from feedback.selectors import trace_as_dict, trace_visible_to
from feedback.selectors.trace_list import Cursor, trace_page, traces_filtered
from feedback.selectors.traces import grade_as_dict
from feedback.services.customer_feedback import (
    customer_feedback_create,
    feedback_link_create,
    feedback_link_resolve,
    feedback_target_find,
)
from feedback.services.grades import grade_record
from feedback.services.ingest import traces_ingest
from feedback.services.jsonl import traces_jsonl_lines, traces_parquet
from webapp.kernel.api_errors import error_response, limit_param
from webapp.kernel.errors import Refused
from webapp.kernel.streaming import PARQUET, streamed

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
        "grades": serializers.JSONField(
            required=False,
            help_text="Your grader's verdicts: [{outcome: success|failure, score?: 0-1, reason?, source?, name?}] "
            "(one per name; sending one again replaces it).",
        ),
    },
)


TRACE_LIST_DEFAULT = 50
TRACE_LIST_MAX = 200
EXPORT_MAX = 100_000
TRACE_LIST_PARAMETERS = [
    ("q", str, "full-text search of the messages (system messages only with system=yes)"),
    ("system", str, "yes: the search looks through system messages too"),
    ("deployment", int, "a deployment's id (an API key reads its own only)"),
    ("environment", str, "the trace's environment"),
    ("version", int, "the id of the model version that served it"),
    ("status", str, "ok, error or in_progress: whether the calls ran (not whether the task was done: see outcome)"),
    ("outcome", str, "success, failure or ungraded: the trace's grades"),
    ("start", str, "from this date (YYYY-MM-DD)"),
    ("end", str, "to this date, inclusive"),
    ("comment", str, "yes or no: has an operator's comment"),
    ("feedback", str, "yes or no: has customer feedback"),
    ("rating", str, "the customer feedback's rating: negative, neutral or positive"),
    ("reward_min", float, "judge reward at least"),
    ("reward_max", float, "judge reward at most"),
    ("flag", str, "carries this failure flag"),
    ("after", str, "the cursor from the previous page's `next`"),
    ("limit", int, f"traces per page, 1-{TRACE_LIST_MAX} ({TRACE_LIST_DEFAULT})"),
]


def _list_filters(request) -> dict:
    """The trace list's filters from the query (a bad one raises the 400 naming it); a
    key's are pinned to its own deployment (another's is a 403)."""
    filters = trace_filters(request.query_params, also=("after", "limit"))
    deployment = getattr(request.user, "deployment", None)
    if deployment is not None:  # a key reads its own deployment's traces only
        if filters.get("deployment", deployment.pk) != deployment.pk:
            raise Refused("this API key reads its own deployment's traces only", field="deployment")
        filters["deployment"] = deployment.pk
    return filters


LIST_PARAMETERS = [
    OpenApiParameter(name, type=kind, description=text, required=False) for name, kind, text in TRACE_LIST_PARAMETERS
]
EXPORT_PARAMETERS = [p for p in LIST_PARAMETERS if p.name not in ("after", "limit")] + [
    OpenApiParameter("limit", int, description=f"at most this many traces (1-{EXPORT_MAX})")
]


class _TraceExport(APIView):
    """The filtered trace list downloaded whole, in the order the traces were stored (oldest
    first; `limit` keeps the first). A key reads its own deployment's traces only."""

    permission_classes = [scope_required(ApiKeyScope.READ)]

    def get(self, request):
        filters = _list_filters(request)
        limit = limit_param(request.query_params, default=EXPORT_MAX, maximum=EXPORT_MAX)
        return self.download(traces_filtered(filters), limit)


class TraceExportApi(_TraceExport):
    """As OpenAI chat fine-tuning JSONL (`messages`, `tools`), one trace a line, streamed:
    what `openai` fine-tuning, TRL and `datasets` read."""

    @extend_schema(
        operation_id="v1_traces_export_jsonl",
        parameters=EXPORT_PARAMETERS,
        responses={200: OpenApiResponse(description="application/x-ndjson: one chat-format line per trace.")},
    )
    def get(self, request):
        return super().get(request)

    def download(self, traces, limit: int):
        lines = traces_jsonl_lines(traces=traces, limit=limit)
        response = StreamingHttpResponse(streamed(lines), content_type="application/x-ndjson")
        response["Content-Disposition"] = 'attachment; filename="traces.jsonl"'
        return response


class TraceExportParquetApi(_TraceExport):
    """As one Parquet file (`messages` as a list of structs, `tools` as JSON text,
    `trace_id`, `external_id`): for pandas, DuckDB and `datasets`."""

    @extend_schema(
        operation_id="v1_traces_export_parquet",
        parameters=EXPORT_PARAMETERS,
        responses={200: OpenApiResponse(description="application/vnd.apache.parquet")},
    )
    def get(self, request):
        return super().get(request)

    def download(self, traces, limit: int):
        data = traces_parquet(traces=traces, limit=limit)
        return FileResponse(data, as_attachment=True, filename="traces.parquet", content_type=PARQUET)


def _trace_summary(row: dict, request) -> dict:
    return {
        "id": row["id"],
        "url": request.build_absolute_uri(reverse("api-trace-detail", args=[row["id"]])),
        "deployment": row["deployment__name"],
        "external_id": row["external_id"],
        "environment": row["environment"],
        "model": row["model_version__name"] or row["model_name"],
        "model_version": row["model_version__name"],
        "started_at": row["started_at"].isoformat(),
        "status": row["status"],
        "message_count": row["message_count"],
        "total_tokens": row["total_tokens"],
        "preview": row["preview"],
        "has_comment": row["has_comment"],
        "has_customer_feedback": row["has_customer_feedback"],
        "feedback_rating": row["feedback_rating"],
        "judge_reward": row["judge_reward"],
        "outcome": row["outcome"] or None,
        "outcome_reason": row["outcome_reason"] or None,
        "outcome_score": row["outcome_score"],
        "ended_at": row["ended_at"].isoformat() if row["ended_at"] else None,
        "flags": row["flags"],
    }


class TraceIngestApi(APIView):
    """GET: the trace list, filtered as on the dashboard, newest first, a page at a time.
    POST: store a batch of traces; answers 207 with one result per item."""

    parser_classes: list = []  # the body is parsed here, after the size check

    def get_permissions(self):
        scope = ApiKeyScope.READ if self.request.method in SAFE_METHODS else ApiKeyScope.INGEST
        return [scope_required(scope)()]

    @extend_schema(
        operation_id="v1_traces_list",
        parameters=LIST_PARAMETERS,
        responses={
            200: OpenApiResponse(
                description="{'results': [trace summaries], 'next': the URL of the next page or null}."
            ),
            400: OpenApiResponse(description="A filter, `after` or `limit` that cannot be read (field and reason)."),
        },
    )
    def get(self, request):
        params = request.query_params
        filters = _list_filters(request)
        after = None
        if params.get("after"):
            after = Cursor.decode(params["after"])
            if after is None:
                return error_response(400, "after", "not a cursor from this API's `next` link")
        limit = limit_param(params, default=TRACE_LIST_DEFAULT, maximum=TRACE_LIST_MAX)
        page = trace_page(filters=filters, after=after, limit=limit)
        results = [_trace_summary(row, request) for row in page.rows]
        following = None
        if page.next_cursor is not None:
            query = params.copy()
            query["after"] = page.next_cursor.encode()
            following = request.build_absolute_uri(f"{request.path}?{query.urlencode()}")
        return Response({"results": results, "next": following})

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
        if not isinstance(request.user, ApiKeyPrincipal):
            return error_response(
                403, "Authorization", "traces are stored for the deployment of an ingest API key; send one"
            )
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


# Customer feedback --------------------------------------------------------------------

_feedback_in = inline_serializer(
    "FeedbackIn",
    fields={
        "trace_id": serializers.IntegerField(required=False, help_text="The trace's id (as ingest returned it)."),
        "external_id": serializers.CharField(required=False, help_text="Or the agent's own id of the trace."),
        "response_id": serializers.CharField(
            required=False, help_text="Or the completion id the gateway returned: the feedback is on that turn."
        ),
        "rating": serializers.JSONField(required=False, help_text="'up' or 'down' (thumbs), or 1-5 (score)."),
        "comment": serializers.CharField(required=False),
        "correction": serializers.CharField(required=False, help_text="What the answer should have been."),
        "customer_ref": serializers.CharField(required=False, help_text="Your reference for the customer."),
        "idempotency_key": serializers.CharField(required=False, help_text="Retries with the same key are safe."),
    },
)


def _json_body(request) -> dict | Response:
    try:
        data = orjson.loads(request._request.body or b"{}")
    except orjson.JSONDecodeError as exc:
        return error_response(400, "body", f"not valid JSON: {exc}")
    if not isinstance(data, dict):
        return error_response(400, "body", "must be a JSON object")
    return data


def _feedback_out(feedback) -> dict:
    return {
        "id": feedback.id,
        "trace_id": feedback.trace_id,
        "message_position": feedback.message.position if feedback.message_id else None,
        "rating": {"kind": feedback.rating_kind, "value": feedback.rating} if feedback.rating is not None else None,
        "comment": feedback.comment,
        "correction": feedback.correction,
        "customer_ref": feedback.customer_ref,
        "idempotency_key": feedback.idempotency_key or None,
        "source": feedback.source,
        "created_at": feedback.created_at.isoformat(),
    }


def _store_feedback(request, data: dict, **kwargs) -> Response:
    feedback, created = customer_feedback_create(data=data, **kwargs)
    return Response(_feedback_out(feedback), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class FeedbackCreateApi(APIView):
    """A customer's feedback on a trace, or on one turn of it (by `response_id`)."""

    permission_classes = [scope_required(ApiKeyScope.FEEDBACK)]
    parser_classes: list = []

    @extend_schema(
        operation_id="feedback_create",
        request=_feedback_in,
        responses={
            201: OpenApiResponse(description="Stored."),
            200: OpenApiResponse(description="A retry: the feedback stored with this idempotency_key."),
            400: OpenApiResponse(description="Invalid field (field and reason)."),
            404: OpenApiResponse(description="No such trace or response in this key's deployment."),
            409: OpenApiResponse(description="The idempotency_key was used with a different request."),
        },
    )
    def post(self, request):
        data = _json_body(request)
        if isinstance(data, Response):
            return data
        principal = request.user
        if not isinstance(principal, ApiKeyPrincipal):
            return error_response(400, "", "customer feedback is posted with a deployment's API key")
        return _store_feedback(request, data, deployment=principal.deployment, api_key=principal.api_key)


class FeedbackLinkCreateApi(APIView):
    """A short-lived signed URL that lets the customer's browser post feedback on one trace
    without a key: open it to get a form, or POST JSON to /api/v1/feedback/links/<token>."""

    permission_classes = [scope_required(ApiKeyScope.FEEDBACK)]
    parser_classes: list = []

    @extend_schema(
        operation_id="feedback_link_create",
        request=inline_serializer(
            "FeedbackLinkIn",
            fields={
                "trace_id": serializers.IntegerField(required=False),
                "external_id": serializers.CharField(required=False),
                "response_id": serializers.CharField(required=False),
                "customer_ref": serializers.CharField(required=False),
                "expires_in": serializers.IntegerField(required=False, help_text="Seconds; default one day."),
            },
        ),
        responses={201: OpenApiResponse(description="{url, api_url, token, expires_at}")},
    )
    def post(self, request):
        data = _json_body(request)
        if isinstance(data, Response):
            return data
        principal = request.user
        if not isinstance(principal, ApiKeyPrincipal):
            return error_response(400, "", "feedback links are made with a deployment's API key")
        expires_in = data.get("expires_in")
        if expires_in is not None and (isinstance(expires_in, bool) or not isinstance(expires_in, int)):
            return error_response(400, "expires_in", "a whole number of seconds")
        customer_ref = data.get("customer_ref") or ""
        if not isinstance(customer_ref, str) or len(customer_ref) > 200:
            return error_response(400, "customer_ref", "a string of at most 200 characters")
        target = feedback_target_find(
            deployment=principal.deployment,
            trace_id=data.get("trace_id"),
            external_id=data.get("external_id"),
            response_id=data.get("response_id"),
        )
        token, expires_at = feedback_link_create(
            target=target,
            customer_ref=customer_ref,
            expires_in=timedelta(seconds=expires_in) if expires_in is not None else None,
        )
        return Response(
            {
                "url": request.build_absolute_uri(reverse("feedback:feedback-link", args=[token])),
                "api_url": request.build_absolute_uri(reverse("api-feedback-link-post", args=[token])),
                "token": token,
                "expires_at": expires_at.isoformat(),
            },
            status=status.HTTP_201_CREATED,
        )


class FeedbackLinkPostApi(APIView):
    """Post feedback through a feedback link's token; no key: the signed token is the credential."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    parser_classes: list = []

    @extend_schema(
        request=_feedback_in,
        responses={
            201: OpenApiResponse(description="Stored."),
            403: OpenApiResponse(description="Expired or invalid."),
            409: OpenApiResponse(description="The link was already used (each link takes one answer)."),
        },
    )
    def post(self, request, token: str):
        link = feedback_link_resolve(token=token)
        data = _json_body(request)
        if isinstance(data, Response):
            return data
        # The link fixes the target and the customer; the body carries only the feedback.
        data = {k: data.get(k) for k in ("rating", "comment", "correction", "idempotency_key")}
        data["customer_ref"] = link.customer_ref
        return _store_feedback(
            request,
            data,
            deployment=link.target.trace.deployment,
            target=link.target,
            source=FeedbackSource.LINK,
            link_id=link.link_id,
        )


# Grades -------------------------------------------------------------------------------


class GradeCreateApi(APIView):
    """A grader's verdict on a trace, from the harness that ran it: its own tests, an
    environment's check of the final state. Stored as a grade (the trace's outcome), never as
    customer feedback. One grade per `name` and trace: sending it again replaces it."""

    permission_classes = [scope_required(ApiKeyScope.INGEST)]
    parser_classes: list = []

    @extend_schema(
        operation_id="grade_create",
        request=inline_serializer(
            "GradeIn",
            fields={
                "trace_id": serializers.IntegerField(
                    required=False, help_text="The trace's id (as ingest returned it)."
                ),
                "external_id": serializers.CharField(required=False, help_text="Or the agent's own id of the trace."),
                "outcome": serializers.ChoiceField(["success", "failure"]),
                "score": serializers.FloatField(required=False, help_text="The grader's number, 0 to 1."),
                "reason": serializers.CharField(required=False, help_text="Why, in the grader's words."),
                "source": serializers.CharField(
                    required=False, help_text="Who graded: an environment, a test suite (default 'api')."
                ),
                "name": serializers.CharField(
                    required=False, help_text="What was graded (default 'outcome', which the overview counts)."
                ),
            },
        ),
        responses={
            201: OpenApiResponse(description="Stored."),
            200: OpenApiResponse(description="Replaced the trace's grade of this name."),
            400: OpenApiResponse(description="Invalid field (field and reason)."),
            404: OpenApiResponse(description="No such trace in this key's deployment."),
        },
    )
    def post(self, request):
        data = _json_body(request)
        if isinstance(data, Response):
            return data
        principal = request.user
        if not isinstance(principal, ApiKeyPrincipal):
            return error_response(400, "", "grades are posted with a deployment's API key")
        grade, created = grade_record(deployment=principal.deployment, data=data, api_key=principal.api_key)
        return Response(grade_as_dict(grade), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)
