"""The training API (`/api/v1/jobs`, `/api/v1/models`): start a job, follow its progress and
metrics, cancel it, and list the model versions it can start from or produced.

Like the promotion API it acts for a person (a logged-in session, or HTTP Basic with the
person's own login), with the permissions of the jobs page: `view_trainingjob` to read,
`add_trainingjob` to start, `change_trainingjob` to cancel. A job's candidate still needs an
evaluation and another person's approval before it serves (the promotion API).
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import SAFE_METHODS, IsAuthenticated
from rest_framework.response import Response

from training import selectors
from training.api_person import PersonApi, needs
from training.models import JobKind, TrainingJob, TrainingSet
from training.services.jobs import JobError, training_job_cancel, training_job_create
from training.serving.models import ModelVersion
from webapp.kernel.api_errors import error_response, limit_param
from webapp.kernel.chat_format import MAX_JSON_DEPTH, json_depth
from webapp.kernel.ids import parse_id
from webapp.kernel.work import WorkStatus

VIEW_JOBS = "training.view_trainingjob"
START_JOBS = "training.add_trainingjob"
CANCEL_JOBS = "training.change_trainingjob"
MAX_LIST = 200


def _version_as_dict(version: ModelVersion | None) -> dict[str, Any] | None:
    if version is None:
        return None
    return {
        "id": version.pk,
        "name": version.name,
        "kind": version.kind,
        "status": version.status,
        "base_model": version.base_model.name,
        "parent": version.parent.name if version.parent_id else None,
        "created_at": version.created_at.isoformat(),
    }


def job_as_dict(job: TrainingJob, *, detail: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": job.pk,
        "kind": job.kind,
        "status": job.status,
        "step": job.step,
        "steps": job.config.get("steps"),
        "base_version": job.base_version.name,
        "training_set": job.training_set_id,
        "result_version": job.result_version.name if job.result_version_id else None,
        "error": job.error,
        "created_by": job.created_by.username if job.created_by_id else None,
        "created_at": job.created_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
    }
    if detail:
        series, _evals, progress = selectors.job_live(job=job)
        out["config"] = job.config
        out["progress"] = {
            "phase": progress.phase,
            "label": progress.label,
            "phase_done": progress.phase_done,
            "phase_total": progress.phase_total,
            "percent": progress.percent,
            "eta_seconds": progress.eta_seconds,
        }
        out["latest"] = {key: points[-1][1] for key, points in series.items() if points and key != "step_seconds"}
        out["latest"].pop("reward_band", None)
    return out


class JobsApi(PersonApi):
    """GET: recent jobs, newest first. POST: start one (queued for a training worker)."""

    def get_permissions(self):
        permission = VIEW_JOBS if self.request.method in SAFE_METHODS else START_JOBS
        return [IsAuthenticated(), needs(permission)()]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TrainingJobIn"

        kind = serializers.ChoiceField(choices=JobKind.choices)
        base_version = serializers.CharField(help_text="the name (or id) of the model version to train from")
        training_set = serializers.IntegerField(required=False, help_text="its id; not for an episodes job")
        config = serializers.DictField(required=False, help_text="the job's settings, as on the jobs page")
        judge_gate_override_reason = serializers.CharField(required=False, allow_blank=True)

    @extend_schema(
        operation_id="v1_jobs_list",
        parameters=[
            OpenApiParameter("status", str, description="only jobs in this status"),
            OpenApiParameter("limit", int, description=f"at most this many (1-{MAX_LIST}, 50)"),
        ],
        responses={200: OpenApiResponse(description="{'results': [jobs]}")},
    )
    def get(self, request):
        limit = limit_param(request.query_params, default=50, maximum=MAX_LIST)
        jobs = TrainingJob.objects.select_related("base_version", "result_version", "created_by")
        status = request.query_params.get("status")
        if status:
            if status not in WorkStatus.values:
                return error_response(400, "status", f"one of {', '.join(WorkStatus.values)}")
            jobs = jobs.filter(status=status)
        return Response({"results": [job_as_dict(j) for j in jobs.order_by("-created_at", "-id")[:limit]]})

    @extend_schema(
        request=InputSerializer,
        responses={
            201: OpenApiResponse(description="The queued job."),
            400: OpenApiResponse(description="Field and reason."),
        },
    )
    def post(self, request):
        if isinstance(request.data, dict) and json_depth(request.data.get("config")) > MAX_JSON_DEPTH:
            raise JobError([("config", f"nested more than {MAX_JSON_DEPTH} levels deep")])
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        given = data.validated_data
        name = given["base_version"]
        pk = parse_id(name)
        version = ModelVersion.objects.filter(name=name).first() or (
            ModelVersion.objects.filter(pk=pk).first() if pk is not None else None
        )
        if version is None:
            raise JobError([("base_version", f"no model version named {name[:100]!r}")])
        training_set = None
        if "training_set" in given:
            training_set = TrainingSet.objects.filter(pk=given["training_set"]).first()
            if training_set is None:
                raise JobError([("training_set", f"no training set {given['training_set']}")])
        elif given["kind"] != JobKind.EPISODES:
            raise JobError([("training_set", "required for this kind of job")])
        job = training_job_create(
            kind=given["kind"],
            config=dict(given.get("config") or {}),
            base_version=version,
            training_set=training_set,
            user=request.user,
            judge_gate_override_reason=given.get("judge_gate_override_reason") or "",
        )
        return Response(job_as_dict(selectors.training_job_get(job_id=job.pk), detail=True), status=201)


class JobDetailApi(PersonApi):
    permission_classes = [IsAuthenticated, needs(VIEW_JOBS)]

    @extend_schema(responses={200: OpenApiResponse(description="The job, its progress and its latest metrics.")})
    def get(self, request, job_id: int):
        job = selectors.training_job_get(job_id=job_id)
        if job is None:
            return error_response(404, "job", f"no training job {job_id}")
        return Response(job_as_dict(job, detail=True))


class JobMetricsApi(PersonApi):
    permission_classes = [IsAuthenticated, needs(VIEW_JOBS)]

    @extend_schema(responses={200: OpenApiResponse(description="Per metric, its [step, value] points.")})
    def get(self, request, job_id: int):
        job = get_object_or_404(TrainingJob, pk=job_id)
        series = selectors.job_step_series(job=job)
        return Response({key: [list(p) for p in points] for key, points in series.items() if key != "step_seconds"})


class JobCancelApi(PersonApi):
    permission_classes = [IsAuthenticated, needs(CANCEL_JOBS)]

    @extend_schema(request=None, responses={200: OpenApiResponse(description="The job, cancelled or cancelling.")})
    def post(self, request, job_id: int):
        job = get_object_or_404(TrainingJob, pk=job_id)
        if not job.is_active:
            return error_response(409, "status", f"the job has ended ({job.status}); there is nothing to cancel")
        training_job_cancel(job=job, user=request.user)
        return Response(job_as_dict(selectors.training_job_get(job_id=job.pk), detail=True))


class ModelVersionsApi(PersonApi):
    permission_classes = [IsAuthenticated, needs(VIEW_JOBS)]

    @extend_schema(
        operation_id="v1_models_list",
        responses={200: OpenApiResponse(description="{'results': [model versions]}, newest first.")},
    )
    def get(self, request):
        versions = ModelVersion.objects.select_related("base_model", "parent").order_by("-created_at", "-id")[:MAX_LIST]
        return Response({"results": [_version_as_dict(v) for v in versions]})
