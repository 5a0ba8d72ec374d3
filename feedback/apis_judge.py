"""The judge's API: agreement per judge version (with the training gate), and the
judgements of a trace."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from feedback.auth import ApiKeyPrincipal, scope_required
from feedback.models import ApiKeyScope, JudgeResult
from feedback.selectors import trace_visible_to
from feedback.selectors.judge import agreement_as_dict, agreement_by_version
from feedback.selectors.judge_gate import judgements_mark_unverified
from training.serving.models import Deployment
from webapp.api_errors import error_response


def judge_result_as_dict(r: JudgeResult) -> dict:
    return {
        "id": r.id,
        "trace_id": r.trace_id,
        "message_position": r.message.position,
        "status": r.status,
        "failure_reason": r.failure_reason or None,
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
        from django.conf import settings

        from feedback.selectors.judge_gate import judge_training_gate

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
