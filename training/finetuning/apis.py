"""OpenAI's `files` and `fine_tuning.jobs` endpoints under `/api/openai/v1/`, so a team's
`openai` code changes its base URL and API key and nothing else.

Answers are OpenAI's objects; errors are OpenAI's `{"error": {message, type, param, code}}`
beside the house's `errors` list. A deployment API key with the `train` scope acts for its
deployment (the SDK sends it as `Authorization: Bearer`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from feedback.auth import ApiKeyAuthentication, ApiKeyPrincipal
from training.finetuning import files, jobs, selectors
from training.finetuning.models import FineTuningFile, FineTuningJob
from webapp.kernel.api_errors import JSONParser, exception_handler, limit_param

TAG = ["OpenAI fine-tuning"]
ERRORS = {
    400: OpenApiResponse(description="OpenAI's error object; `param` names the field"),
    404: OpenApiResponse(description="Not a file or job of this key's deployment"),
}
UPLOAD = {
    "multipart/form-data": {
        "type": "object",
        "properties": {
            "file": {"type": "string", "format": "binary"},
            "purpose": {"type": "string", "enum": ["fine-tune"]},
        },
        "required": ["file", "purpose"],
    }
}
JOB_REQUEST = {
    "application/json": {
        "type": "object",
        "properties": {
            "model": {"type": "string", "description": "a model version's name"},
            "training_file": {"type": "string"},
            "validation_file": {"type": "string"},
            "method": {"type": "object", "description": "supervised or reinforcement, as OpenAI's"},
            "suffix": {"type": "string"},
            "seed": {"type": "integer"},
            "metadata": {"type": "object", "additionalProperties": {"type": "string"}},
        },
        "required": ["model", "training_file"],
    }
}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
}


class TrainKey(BasePermission):
    message = "use a deployment API key with the 'train' scope (Authorization: Bearer …)"

    def has_permission(self, request, view) -> bool:
        user = request.user
        if isinstance(user, ApiKeyPrincipal) and not user.has_scope("train"):
            self.message = "this API key lacks the 'train' scope"
        return isinstance(user, ApiKeyPrincipal) and user.has_scope("train")


def openai_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """The house's error answer, with OpenAI's error object added: the SDK raises it as
    `openai.BadRequestError` (and the others) with `param` naming the field."""
    response = exception_handler(exc, context)
    if response is None:
        return None
    data = response.data if isinstance(response.data, dict) else {"detail": str(response.data)}
    errors = data.get("errors") or []
    data["error"] = {
        "message": data.get("detail", ""),
        "type": ERROR_TYPES.get(response.status_code, "invalid_request_error"),
        "param": errors[0]["field"] if errors else None,
        "code": None,
    }
    response.data = data
    return response


class OpenAIApi(APIView):
    authentication_classes = [ApiKeyAuthentication]
    permission_classes = [TrainKey]
    parser_classes = [JSONParser]

    def get_exception_handler(self):
        return openai_exception_handler

    @property
    def api_key(self):
        return self.request.user.api_key

    def body(self) -> dict[str, Any]:
        if not isinstance(self.request.data, dict):
            raise exceptions.ValidationError({"body": ["must be a JSON object"]})
        return self.request.data


def file_object(upload: FineTuningFile) -> dict[str, Any]:
    return {
        "id": upload.id,
        "object": "file",
        "bytes": upload.bytes,
        "created_at": int(upload.created_at.timestamp()),
        "filename": upload.filename,
        "purpose": upload.purpose,
        "status": upload.status,
        "status_details": upload.status_details or None,
    }


def _page(rows: list, limit: int, render) -> dict[str, Any]:
    data = [render(r) for r in rows[:limit]]
    return {
        "object": "list",
        "data": data,
        "has_more": len(rows) > limit,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


class FilesApi(OpenAIApi):
    parser_classes = [MultiPartParser]

    @extend_schema(
        tags=TAG,
        operation_id="openai_files_list",
        summary="List uploaded fine-tuning files",
        responses={200: OpenApiResponse(description="List uploaded fine-tuning files"), **ERRORS},
    )
    def get(self, request):
        limit = limit_param(request.query_params, default=100, maximum=10_000)
        rows = files.files_list(
            api_key=self.api_key,
            purpose=request.query_params.get("purpose") or None,
            after=request.query_params.get("after") or None,
            limit=limit,
            order=request.query_params.get("order") or "desc",
        )
        return Response(_page(rows, limit, file_object))

    @extend_schema(
        tags=TAG,
        operation_id="openai_files_create",
        summary="Upload a JSONL file (purpose fine-tune)",
        request=UPLOAD,
        responses={200: OpenApiResponse(description="Upload a JSONL file (purpose fine-tune)"), **ERRORS},
    )
    def post(self, request):
        upload = request.FILES.get("file")
        if upload is None:
            raise exceptions.ValidationError({"file": ["upload the JSONL as the multipart field 'file'"]})
        created = files.file_create(
            api_key=self.api_key,
            filename=upload.name,
            purpose=request.data.get("purpose", ""),
            data=upload.read(settings.FINETUNE_FILE_MAX_BYTES + 1),
        )
        return Response(file_object(created))


class FileDetailApi(OpenAIApi):
    @extend_schema(
        tags=TAG,
        operation_id="openai_files_retrieve",
        summary="A file",
        responses={200: OpenApiResponse(description="A file"), **ERRORS},
    )
    def get(self, request, file_id: str):
        return Response(file_object(files.file_get(api_key=self.api_key, file_id=file_id)))

    @extend_schema(
        tags=TAG,
        operation_id="openai_files_delete",
        summary="Delete a file",
        responses={200: OpenApiResponse(description="Delete a file"), **ERRORS},
    )
    def delete(self, request, file_id: str):
        gone = files.file_delete(api_key=self.api_key, file_id=file_id)
        return Response({"id": gone.id, "object": "file", "deleted": True})


class AnyAccept(DefaultContentNegotiation):
    """The SDK asks for a file's bytes with `Accept: application/binary`; the bytes (and any
    error) are answered whatever it asks for."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class FileContentApi(OpenAIApi):
    content_negotiation_class = AnyAccept

    @extend_schema(
        tags=TAG,
        operation_id="openai_files_content",
        summary="A file's bytes",
        responses={200: OpenApiResponse(description="A file's bytes"), **ERRORS},
    )
    def get(self, request, file_id: str):
        upload = files.file_get(api_key=self.api_key, file_id=file_id)
        return HttpResponse(upload.content.encode(), content_type="application/jsonl")


def job_object(ft: FineTuningJob) -> dict[str, Any]:
    job = ft.job
    status = selectors.job_status(job)
    failed = status == "failed"
    return {
        "id": f"ftjob-{job.pk}",
        "object": "fine_tuning.job",
        "created_at": int(job.created_at.timestamp()),
        "finished_at": int(job.finished_at.timestamp()) if job.finished_at else None,
        "model": ft.model,
        "fine_tuned_model": job.result_version.name if job.result_version_id else None,
        "organization_id": f"deployment-{job.deployment_id}",
        "status": status,
        "training_file": ft.training_file_id,
        "validation_file": ft.validation_file_id,
        "hyperparameters": ft.hyperparameters,
        "method": {
            "type": ft.method.get("type"),
            ft.method.get("type"): {
                "hyperparameters": ft.hyperparameters,
                **({"grader": ft.method["grader"]} if ft.method.get("grader") else {}),
            },
        },
        "result_files": [],
        "trained_tokens": None,
        "seed": ft.seed,
        "suffix": ft.suffix or None,
        "metadata": ft.metadata or None,
        "error": (ft.failure or {"code": job.status, "message": job.error or "the job did not finish", "param": None})
        if failed
        else None,
        "estimated_finish": None,
        "integrations": [],
        # Practicum's own: the training job behind it, and that the result is a candidate.
        "practicum": {"training_job": job.pk, "step": job.step, "steps": job.total_steps, "candidate": True},
    }


class JobsApi(OpenAIApi):
    @extend_schema(
        tags=TAG,
        operation_id="openai_fine_tuning_jobs_list",
        summary="List fine-tuning jobs",
        responses={200: OpenApiResponse(description="List fine-tuning jobs"), **ERRORS},
    )
    def get(self, request):
        limit = limit_param(request.query_params, default=20, maximum=100)
        metadata = {
            k[9:-1]: v for k, v in request.query_params.items() if k.startswith("metadata[") and k.endswith("]")
        }
        rows = jobs.fine_tuning_jobs_list(
            api_key=self.api_key, after=request.query_params.get("after") or None, limit=limit, metadata=metadata
        )
        page = _page(rows, limit, job_object)
        return Response({k: page[k] for k in ("object", "data", "has_more")})

    @extend_schema(
        tags=TAG,
        operation_id="openai_fine_tuning_jobs_create",
        summary="Start a fine-tuning job",
        request=JOB_REQUEST,
        responses={200: OpenApiResponse(description="Start a fine-tuning job"), **ERRORS},
    )
    def post(self, request):
        body = self.body()
        unknown = sorted(
            set(body)
            - {
                "model",
                "training_file",
                "validation_file",
                "method",
                "hyperparameters",
                "suffix",
                "seed",
                "metadata",
                "integrations",
            }
        )
        if unknown:
            raise exceptions.ValidationError({unknown[0]: ["is not a field of a fine-tuning job"]})
        if body.get("integrations"):
            raise exceptions.ValidationError({"integrations": ["are not served here"]})
        ft = jobs.fine_tuning_job_create(
            api_key=self.api_key,
            model=body.get("model"),
            training_file=body.get("training_file"),
            validation_file=body.get("validation_file"),
            method=body.get("method"),
            hyperparameters=body.get("hyperparameters"),
            suffix=body.get("suffix"),
            seed=body.get("seed"),
            metadata=body.get("metadata"),
        )
        return Response(job_object(ft))


class JobDetailApi(OpenAIApi):
    @extend_schema(
        tags=TAG,
        operation_id="openai_fine_tuning_jobs_retrieve",
        summary="A fine-tuning job",
        responses={200: OpenApiResponse(description="A fine-tuning job"), **ERRORS},
    )
    def get(self, request, job_id: str):
        return Response(job_object(jobs.fine_tuning_job_get(api_key=self.api_key, job_id=job_id)))


class JobCancelApi(OpenAIApi):
    @extend_schema(
        tags=TAG,
        operation_id="openai_fine_tuning_jobs_cancel",
        summary="Cancel a fine-tuning job",
        request=None,
        responses={200: OpenApiResponse(description="Cancel a fine-tuning job"), **ERRORS},
    )
    def post(self, request, job_id: str):
        return Response(job_object(jobs.fine_tuning_job_cancel(api_key=self.api_key, job_id=job_id)))


class JobEventsApi(OpenAIApi):
    @extend_schema(
        tags=TAG,
        operation_id="openai_fine_tuning_jobs_events",
        summary="A fine-tuning job's events",
        responses={200: OpenApiResponse(description="A fine-tuning job's events"), **ERRORS},
    )
    def get(self, request, job_id: str):
        ft = jobs.fine_tuning_job_get(api_key=self.api_key, job_id=job_id)
        limit = limit_param(request.query_params, default=20, maximum=1000)
        rows = selectors.job_events(ft=ft, after=request.query_params.get("after") or None, limit=limit)

        def render(event) -> dict[str, Any]:
            level, kind, message = selectors.event_message(event, ft.job.total_steps)
            data = event.data if kind == "metrics" else {}
            if event.kind == "step" and "loss" in data:  # OpenAI's names beside Practicum's
                data = {**data, "train_loss": data["loss"], "total_steps": ft.job.total_steps}
            return {
                "id": f"ftevent-{event.pk}",
                "object": "fine_tuning.job.event",
                "created_at": int(event.created_at.timestamp()),
                "level": level,
                "message": message,
                "type": kind,
                "data": data,
            }

        page = _page(rows, limit, render)
        return Response({k: page[k] for k in ("object", "data", "has_more")})


class JobCheckpointsApi(OpenAIApi):
    @extend_schema(
        tags=TAG,
        operation_id="openai_fine_tuning_jobs_checkpoints",
        summary="A fine-tuning job's servable checkpoints (its candidate version)",
        responses={
            200: OpenApiResponse(description="A fine-tuning job's servable checkpoints (its candidate version)"),
            **ERRORS,
        },
    )
    def get(self, request, job_id: str):
        ft = jobs.fine_tuning_job_get(api_key=self.api_key, job_id=job_id)
        job = ft.job
        data = []
        if job.result_version_id:
            data.append(
                {
                    "id": f"ftckpt-{job.pk}-{job.step}",
                    "object": "fine_tuning.job.checkpoint",
                    "created_at": int(job.result_version.created_at.timestamp()),
                    "fine_tuned_model_checkpoint": job.result_version.name,
                    "fine_tuning_job_id": f"ftjob-{job.pk}",
                    "step_number": job.step,
                    "metrics": selectors.checkpoint_metrics(job),
                }
            )
        first = data[0]["id"] if data else None
        return Response({"object": "list", "data": data, "has_more": False, "first_id": first, "last_id": first})
