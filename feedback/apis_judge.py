"""The judge's API: agreement per judge version (with the training gate), and the
judgements of a trace."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import BasePermission, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from feedback.auth import ApiKeyPrincipal, scope_required
from feedback.models import ApiKeyScope, CorrectionMode, DeploymentJudge, JudgeResult, SchemaMode
from feedback.selectors import trace_visible_to
from feedback.selectors.judge import agreement_as_dict, agreement_by_version
from feedback.selectors.judge_gate import judge_training_gate, judgements_mark_unverified
from feedback.services.judging import deployment_judge_set
from training.serving.models import Deployment
from webapp.kernel.api_errors import error_response
from webapp.kernel.auth import ThrottledBasicAuthentication

SET_JUDGE = "feedback.change_deploymentjudge"


def judge_result_as_dict(r: JudgeResult) -> dict:
    return {
        "id": r.id,
        "trace_id": r.trace_id,
        "message_position": r.message.position,
        "status": r.status,
        "failure_reason": r.error or None,
        "trigger": r.trigger,
        "judge_model": r.judge_model,
        "prompt_version": r.prompt_version,
        "rubric": r.rubric,
        "reward": r.reward,
        # Why the judge is not verified (its agreement gate has not passed), or null.
        "unverified": getattr(r, "unverified", "") or None,
        "rationale": r.rationale,
        "corrected_response": r.corrected_response or None,
        "corrected_response_author": "judge" if r.corrected_response else None,
        "action": r.action,
        "guard_reason": r.guard_reason or None,
        "is_latest": r.is_latest,
        "latency_ms": r.latency_ms,
        "usage": {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens},
        "cost": r.cost,
        "comment_ids": [c.pk for c in r.comments.all()],
        "customer_feedback_ids": [f.pk for f in r.customer_feedback.all()],
        "created_at": r.created_at.isoformat(),
    }


class JudgeAgreementApi(APIView):
    """Agreement of each judge version with operators' turn ratings, and whether training
    may use its rewards. An API key sees its own deployment only."""

    permission_classes = [scope_required(ApiKeyScope.READ)]

    @extend_schema(
        parameters=[OpenApiParameter("deployment", str, required=False, description="a deployment name")],
        responses={200: OpenApiResponse(description="Per judge version: kappa, Spearman, n, CIs, order-swap.")},
    )
    def get(self, request):
        deployment = None
        if isinstance(request.user, ApiKeyPrincipal):
            deployment = request.user.deployment
            asked = request.query_params.get("deployment")
            if asked and asked != deployment.name:
                return error_response(403, "deployment", "this API key reads its own deployment only")
        elif request.query_params.get("deployment"):
            deployment = Deployment.objects.filter(name=request.query_params["deployment"]).first()
            if deployment is None:
                return error_response(400, "deployment", "no deployment of that name")
        return Response(
            {
                "deployment": deployment.name if deployment else None,
                "min_kappa": settings.JUDGE_REWARD_MIN_KAPPA,
                "min_n": settings.JUDGE_REWARD_MIN_N,
                "pass_threshold": settings.JUDGE_PASS_THRESHOLD,
                "versions": [agreement_as_dict(row) for row in agreement_by_version(deployment=deployment)],
                "training_gate": judge_training_gate(deployment=deployment).as_dict(),
            }
        )


class TraceJudgementsApi(APIView):
    """Every judgement of a trace's turns, newest first (old versions included)."""

    permission_classes = [scope_required(ApiKeyScope.READ)]

    @extend_schema(responses={200: OpenApiResponse(description="The trace's judgements.")})
    def get(self, request, trace_id: int):
        trace = get_object_or_404(trace_visible_to(request.user), pk=trace_id)
        results = list(
            JudgeResult.objects.filter(trace=trace)
            .select_related("message")
            .prefetch_related("comments", "customer_feedback")
            .order_by("-created_at", "-id")
        )
        judgements_mark_unverified(results)
        return Response({"trace_id": trace.pk, "judgements": [judge_result_as_dict(r) for r in results]})


def deployment_judge_as_dict(judge: DeploymentJudge) -> dict:
    return {
        "deployment": judge.deployment.name,
        "base_url": judge.base_url,
        "model": judge.model,
        "api_key_env": judge.api_key_env,
        "schema_mode": judge.schema_mode,
        "correction_mode": judge.correction_mode,
        "updated_at": judge.updated_at.isoformat(),
    }


class _MaySetJudge(BasePermission):
    message = f"your role does not include {SET_JUDGE}"

    def has_permission(self, request, view) -> bool:
        return bool(request.user and request.user.is_authenticated and request.user.has_perm(SET_JUDGE))


class DeploymentJudgeApi(APIView):
    """A deployment's own judge endpoint: read it, or set it (admins). `correction_mode`
    "actions" has the judge choose each corrected turn among the agent's own actions."""

    authentication_classes = [SessionAuthentication, ThrottledBasicAuthentication]
    permission_classes = [IsAuthenticated, _MaySetJudge]

    class InputSerializer(serializers.Serializer):
        base_url = serializers.URLField(max_length=500)
        model = serializers.CharField(max_length=200)
        api_key_env = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
        schema_mode = serializers.ChoiceField(choices=SchemaMode.values, default=SchemaMode.FULL)
        correction_mode = serializers.ChoiceField(choices=CorrectionMode.values, default=CorrectionMode.TEXT)

    @extend_schema(responses={200: OpenApiResponse(description="The deployment's judge endpoint.")})
    def get(self, request, name: str):
        deployment = get_object_or_404(Deployment, name=name)
        judge = DeploymentJudge.objects.filter(deployment=deployment).select_related("deployment").first()
        if judge is None:
            return error_response(404, "deployment", "this deployment uses the settings' judge")
        return Response(deployment_judge_as_dict(judge))

    @extend_schema(request=InputSerializer, responses={200: OpenApiResponse(description="The judge as set.")})
    def put(self, request, name: str):
        deployment = get_object_or_404(Deployment, name=name)
        data = self.InputSerializer(data=request.data)
        if not data.is_valid():
            field, reasons = next(iter(data.errors.items()))
            return error_response(400, field, str(reasons[0]))
        try:
            judge = deployment_judge_set(deployment=deployment, **data.validated_data)
        except ValidationError as exc:
            field, reasons = next(iter(exc.message_dict.items()))
            return error_response(400, field, reasons[0])
        return Response(deployment_judge_as_dict(judge))
