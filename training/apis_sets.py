"""The training-set API (`/api/v1/training-sets`): build a set from the trace list's filters or
an annotation queue, list and read sets, and download a set's items as JSONL.

For a person, with the jobs page's permissions (`view_trainingset` to read, `add_trainingset`
to build). The judge's training gate applies as on the page: a set that carries the judge's
output needs the gate open or a named override reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson
from django.db import IntegrityError
from django.http import FileResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import SAFE_METHODS, IsAuthenticated
from rest_framework.response import Response

from feedback.failure_modes.apis import cluster_as_dict, failure_cluster_for, made_from_failure_mode_responses
from feedback.forms import trace_filters
from feedback.judge.scoring import served_calls_problem
from training.api_person import PersonApi, needs
from training.inference.codec import tool_calls_parse
from training.models import TrainingItem, TrainingSet, TrainingSplit
from training.services.evaluation_slices import evaluation_slice_from_failure_cluster
from training.services.feedback_sets import training_set_from_feedback
from training.services.training_sets import ITEM_FIELDS as STORED_ITEM_FIELDS
from training.services.training_sets import TrainingSetError
from webapp.kernel.api_errors import error_response
from webapp.kernel.errors import Invalid
from webapp.kernel.streaming import PARQUET, streamed

VIEW_SETS = "training.view_trainingset"
BUILD_SETS = "training.add_trainingset"
# Every stored field of an item but the ids of its trace and message (this database's own).
ITEM_FIELDS = ("split", *sorted(STORED_ITEM_FIELDS - {"trace_id", "message_id"}))


def set_as_dict(s: TrainingSet) -> dict[str, Any]:
    """A set's fields (`failure_cluster`: the failure mode an evaluation slice was made from)."""
    return {
        "id": s.pk,
        "name": s.name,
        "version": s.version,
        "deployment": s.deployment.name if s.deployment_id else None,
        "description": s.description,
        "selection": s.selection,
        "heldout_fraction": s.heldout_fraction,
        "item_count": s.item_count,
        "train_count": s.train_count,
        "heldout_count": s.heldout_count,
        "failure_cluster": s.failure_cluster_id,
        "created_by": s.created_by.username if s.created_by_id else None,
        "created_at": s.created_at.isoformat(),
    }


class TrainingSetsApi(PersonApi):
    """GET: the sets, newest first. POST: build the next version of a set from trace filters
    (the trace list's, as an object) or an annotation queue."""

    def get_permissions(self):
        permission = VIEW_SETS if self.request.method in SAFE_METHODS else BUILD_SETS
        return [IsAuthenticated(), needs(permission)()]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TrainingSetIn"

        name = serializers.SlugField(max_length=100)
        filters = serializers.DictField(required=False, help_text="the trace list's filters, e.g. {'comment': 'yes'}")
        queue = serializers.IntegerField(required=False, help_text="or an annotation queue's id")
        heldout_fraction = serializers.FloatField(required=False, min_value=0, max_value=0.99, default=0.2)
        judge_gate_override_reason = serializers.CharField(required=False, allow_blank=True, default="")

    @extend_schema(operation_id="v1_training_sets_list", responses={200: OpenApiResponse(description="{'results'}")})
    def get(self, request):
        sets = TrainingSet.objects.select_related("deployment", "created_by").order_by("-created_at", "-id")[:200]
        return Response({"results": [set_as_dict(s) for s in sets]})

    @extend_schema(request=InputSerializer, responses={201: OpenApiResponse(description="The set as built.")})
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        given = data.validated_data
        if ("filters" in given) == ("queue" in given):
            return error_response(400, "filters", "give either trace filters or a queue")
        filters = None
        if "filters" in given:
            filters = trace_filters(given["filters"], prefix="filters.")
        try:
            built = training_set_from_feedback(
                name=given["name"],
                filters=filters,
                queue_id=given.get("queue"),
                heldout_fraction=given["heldout_fraction"],
                user=request.user,
                judge_gate_override_reason=given["judge_gate_override_reason"],
            )
        except TrainingSetError as exc:
            field, reason = exc.errors[0]
            return error_response(400, field, reason)
        except IntegrityError:  # another build of this name took the next version first
            return error_response(409, "name", "another build of this set finished at the same moment; send it again")
        return Response(set_as_dict(built), status=201)


class TrainingSetDetailApi(PersonApi):
    permission_classes = [IsAuthenticated, needs(VIEW_SETS)]

    @extend_schema(responses={200: OpenApiResponse(description="The set.")})
    def get(self, request, set_id: int):
        return Response(set_as_dict(get_object_or_404(TrainingSet, pk=set_id)))


ITEMS_PARAMETERS = [
    OpenApiParameter("as", str, enum=["items", "chat"], description="items (default) or chat"),
    OpenApiParameter("split", str, enum=["train", "heldout"], description="only this split"),
]
# Each item field's Parquet column (`messages` has its own fixed type).
ITEM_COLUMNS = {
    "kind": "text",
    "key": "text",
    "tools": "json",
    "rubric": "json",
    "feedback": "text",
    "logged_response": "json",
    "reward": "float",
    "corrected_response": "text",
    "correction_source": "text",
    "reference": "text",
    "grader": "text",
    "provenance": "json",
    "split": "text",
}


class TrainingSetItemsApi(PersonApi):
    """The set's items as JSONL, streamed: every field (`as=items`, the default), or the
    OpenAI chat fine-tuning format (`as=chat`: each context with its corrected response
    as the assistant's turn, items without one left out)."""

    permission_classes = [IsAuthenticated, needs(VIEW_SETS)]

    @extend_schema(
        operation_id="v1_training_sets_items_jsonl",
        parameters=ITEMS_PARAMETERS,
        responses={200: OpenApiResponse(description="application/x-ndjson")},
    )
    def get(self, request, set_id: int):
        training_set, items, kind = _items_asked(request, set_id)
        response = StreamingHttpResponse(streamed(_lines(items, kind)), content_type="application/x-ndjson")
        response["Content-Disposition"] = f'attachment; filename="{training_set.name}-v{training_set.version}.jsonl"'
        return response


class TrainingSetItemsParquetApi(PersonApi):
    """The same rows as one Parquet file (`webapp.kernel.parquet`: `messages` as a list of structs,
    free-form fields as JSON text)."""

    permission_classes = [IsAuthenticated, needs(VIEW_SETS)]

    @extend_schema(
        operation_id="v1_training_sets_items_parquet",
        parameters=ITEMS_PARAMETERS,
        responses={200: OpenApiResponse(description="application/vnd.apache.parquet")},
    )
    def get(self, request, set_id: int):
        from webapp.kernel.parquet import parquet_file  # noqa: PLC0415 — pyarrow (60 MB) for an export only

        training_set, items, kind = _items_asked(request, set_id)
        columns = {"tools": "json"} if kind == "chat" else ITEM_COLUMNS
        data = parquet_file(_rows(items, kind), columns=columns)
        name = f"{training_set.name}-v{training_set.version}.parquet"
        return FileResponse(data, as_attachment=True, filename=name, content_type=PARQUET)


def _items_asked(request, set_id: int):
    """The set, its items under the request's `as` and `split`, and the `as` kind; a bad
    value is a 400 naming it."""
    training_set = get_object_or_404(TrainingSet, pk=set_id)
    kind = request.query_params.get("as") or "items"
    if kind not in ("items", "chat"):
        raise Invalid("items or chat", field="as")
    split = request.query_params.get("split") or ""
    if split and split not in TrainingSplit.values:
        raise Invalid(f"one of {', '.join(TrainingSplit.values)}", field="split")
    items = TrainingItem.objects.filter(training_set=training_set)
    if split:
        items = items.filter(split=split)
    if kind == "chat":
        items = items.exclude(corrected_response="")
    return training_set, items, kind


def _assistant(text: str, tools: Any) -> dict[str, Any]:
    """A corrected response as the chat format writes a turn: `<tool_call>` blocks become
    `tool_calls` entries, as the inference server would have returned them, when they are
    calls the agent could have made (`served_calls_problem`). Otherwise the text stays
    words: it must not become a call no check ever saw."""
    words, calls = tool_calls_parse(text) if served_calls_problem(text, tools or []) is None else (text, [])
    message: dict[str, Any] = {"role": "assistant", "content": (words or None) if calls else text}
    if calls:
        message["tool_calls"] = calls
    return message


def _rows(items, kind: str) -> Iterator[dict[str, Any]]:
    last = 0
    while True:
        chunk = list(items.filter(pk__gt=last).order_by("pk").values("pk", *ITEM_FIELDS)[:500])
        if not chunk:
            return
        last = chunk[-1]["pk"]
        for row in chunk:
            if kind == "chat":
                line: dict[str, Any] = {
                    "messages": [*row["messages"], _assistant(row["corrected_response"], row["tools"])]
                }
                if row["tools"]:
                    line["tools"] = row["tools"]
                yield line
            else:
                yield {k: row[k] for k in ITEM_FIELDS}


def _lines(items, kind: str) -> Iterator[bytes]:
    for row in _rows(items, kind):
        yield orjson.dumps(row) + b"\n"


class FailureClusterSliceApi(PersonApi):
    """POST: a failure mode's evaluation slice — the turns its notes are about, every one held
    out — (201), or the slice already made for it (200, `"created": false`). The page's
    permissions: seeing failure modes and building training sets."""

    permission_classes = [IsAuthenticated, needs("feedback.view_trace"), needs(BUILD_SETS)]

    @extend_schema(
        request=None,
        responses=made_from_failure_mode_responses("training_set"),
    )
    def post(self, request, cluster_id: str):
        cluster = failure_cluster_for(cluster_id)
        built, created = evaluation_slice_from_failure_cluster(cluster=cluster, user=request.user)
        built = TrainingSet.objects.select_related("deployment", "created_by").get(pk=built.pk)
        body = {"created": created, "training_set": set_as_dict(built), "failure_mode": cluster_as_dict(cluster)}
        return Response(body, status=201 if created else 200)
