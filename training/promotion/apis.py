"""The evaluation, promotion, release and audit API (`/api/v1/...`), one class per operation.

These act for a person: a logged-in session, or HTTP Basic with the person's own login
for scripts. Deployment API keys are not accepted — approval means someone decided.
A refused precondition is a 409 naming the field; a missing permission or a requester
approving their own request a 403; bad input a 400.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from training.api_person import VIEW, PersonApi, needs
from training.models import TrainingSet
from training.promotion.models import Evaluation, PromotionRequest, PromotionStatus
from training.promotion.selectors import (
    audit_as_dict,
    audit_cursor,
    audit_cursor_text,
    audit_trail,
    evaluation_as_dict,
    evaluation_get,
    evaluation_items,
    promotion_as_dict,
    promotion_get,
    promotion_summary_as_dict,
    promotions_recent,
    release_as_dict,
    release_get,
)
from training.promotion.services.evaluation import GENERATORS, evaluation_cancel, evaluation_create
from training.promotion.services.promotion import (
    promotion_approve,
    promotion_approve_check,
    promotion_reject,
    promotion_request_create,
    promotion_withdraw,
)
from training.promotion.services.release_plans import release_plan_default, release_plan_for_approval
from training.promotion.services.rollback import rollback_request
from training.serving.models import Deployment, ModelVersion
from webapp.kernel.api_errors import error_response, limit_param

EVALUATE = "training.add_evaluation"

_versions = ModelVersion.objects.select_related("base_model")


class EvaluationCreateApi(PersonApi):
    """Evaluate a candidate against the deployment's live version on held-out items."""

    permission_classes = [IsAuthenticated, needs(EVALUATE)]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "EvaluationCreateInput"

        candidate = serializers.SlugRelatedField(slug_field="name", queryset=_versions)
        deployment = serializers.SlugRelatedField(slug_field="name", queryset=Deployment.objects.all())
        training_set = serializers.PrimaryKeyRelatedField(
            queryset=TrainingSet.objects.all(), required=False, help_text="evaluate on its held-out items"
        )
        trace_ids = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False, max_length=500)
        items = serializers.ListField(child=serializers.JSONField(), required=False, max_length=500)
        generator = serializers.ChoiceField(choices=GENERATORS, required=False)
        max_tokens = serializers.IntegerField(min_value=1, max_value=8192, required=False)
        temperature = serializers.FloatField(min_value=0, max_value=2, required=False)
        environment = serializers.CharField(
            required=False, max_length=100, help_text="also run whole episodes of this environment's tasks"
        )
        environment_split = serializers.CharField(
            required=False, max_length=50, help_text="its split (default: test, else heldout)"
        )
        environment_tasks = serializers.IntegerField(min_value=1, max_value=500, required=False)
        fresh_seed = serializers.IntegerField(
            min_value=0, required=False, help_text="a slice of tasks generated anew from this seed"
        )

    @extend_schema(request=InputSerializer, responses={201: OpenApiResponse(description="The queued evaluation.")})
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        evaluation = evaluation_create(
            candidate=v["candidate"],
            deployment=v["deployment"],
            created_by=request.user,
            training_set=v.get("training_set"),
            trace_ids=v.get("trace_ids", []),
            items=v.get("items", []),
            generator=v.get("generator"),
            max_tokens=v.get("max_tokens"),
            temperature=v.get("temperature"),
            environment=v.get("environment", ""),
            environment_split=v.get("environment_split", ""),
            environment_tasks=v.get("environment_tasks"),
            fresh_seed=v.get("fresh_seed"),
        )
        return Response(evaluation_as_dict(evaluation_get(evaluation_id=evaluation.pk)), status=201)


class EvaluationDetailApi(PersonApi):
    """An evaluation's status, progress and summary; `?items=1` adds every item."""

    @extend_schema(
        parameters=[OpenApiParameter("items", bool, required=False, description="include per-item results")],
        responses={200: OpenApiResponse(description="The evaluation.")},
    )
    def get(self, request, evaluation_id: int):
        evaluation = evaluation_get(evaluation_id=evaluation_id)
        if evaluation is None:
            return error_response(404, "evaluation_id", "no such evaluation")
        items = list(evaluation_items(evaluation=evaluation)) if request.query_params.get("items") else None
        return Response(evaluation_as_dict(evaluation, items=items))


class EvaluationCancelApi(PersonApi):
    permission_classes = [IsAuthenticated, needs(EVALUATE)]

    @extend_schema(request=None, responses={200: OpenApiResponse(description="The evaluation.")})
    def post(self, request, evaluation_id: int):
        evaluation = get_object_or_404(Evaluation, pk=evaluation_id)
        evaluation_cancel(evaluation=evaluation, user=request.user)
        return Response(evaluation_as_dict(evaluation_get(evaluation_id=evaluation_id)))


class PromotionRequestsApi(PersonApi):
    """The requests: POST asks for a candidate to become the deployment's live version;
    GET lists them, newest first (`?status=pending` for those waiting for a decision)."""

    permission_classes = [IsAuthenticated]  # the service names the permission it needs

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "PromotionRequestCreateInput"

        candidate = serializers.SlugRelatedField(slug_field="name", queryset=_versions)
        deployment = serializers.SlugRelatedField(slug_field="name", queryset=Deployment.objects.all())
        evaluation = serializers.PrimaryKeyRelatedField(queryset=Evaluation.objects.select_related("baseline"))
        note = serializers.CharField(required=False, allow_blank=True, max_length=5000, default="")
        breach_override_reason = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")
        rebase_reason = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")
        regression_override_reason = serializers.CharField(
            required=False, allow_blank=True, max_length=2000, default=""
        )

    @extend_schema(request=InputSerializer, responses={201: OpenApiResponse(description="The request.")})
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        promotion = promotion_request_create(
            candidate=v["candidate"],
            deployment=v["deployment"],
            evaluation=v["evaluation"],
            requested_by=request.user,
            note=v["note"],
            breach_override_reason=v["breach_override_reason"],
            rebase_reason=v["rebase_reason"],
            regression_override_reason=v["regression_override_reason"],
        )
        promotion = promotion_get(promotion_id=promotion.pk)
        return Response(promotion_as_dict(promotion, preconditions=promotion_approve_check(promotion=promotion)), 201)

    @extend_schema(
        operation_id="v1_promotions_list",
        parameters=[
            OpenApiParameter("status", str, required=False, enum=PromotionStatus.values),
            OpenApiParameter("limit", int, required=False, description="1-200, default 50"),
        ],
        responses={200: OpenApiResponse(description="Promotion requests.")},
    )
    def get(self, request):
        if not request.user.has_perm(VIEW):
            raise PermissionDenied(f"your role does not include {VIEW}")
        status_ = request.query_params.get("status") or None
        if status_ and status_ not in PromotionStatus.values:
            return error_response(400, "status", f"one of {', '.join(PromotionStatus.values)}")
        limit = limit_param(request.query_params, default=50, maximum=200)
        rows = promotions_recent(limit=limit, status=status_)
        return Response({"promotions": [promotion_summary_as_dict(p) for p in rows]})


class PromotionRequestDetailApi(PersonApi):
    """A request, its snapshot, its preconditions for you now, and its releases."""

    @extend_schema(responses={200: OpenApiResponse(description="The request.")})
    def get(self, request, promotion_id: int):
        promotion = promotion_get(promotion_id=promotion_id)
        if promotion is None:
            return error_response(404, "promotion_id", "no such promotion request")
        checks = promotion_approve_check(promotion=promotion, user=request.user)
        return Response(promotion_as_dict(promotion, preconditions=checks))


class CommentSerializer(serializers.Serializer):
    comment = serializers.CharField(required=False, allow_blank=True, max_length=5000, default="")


class ApproveSerializer(CommentSerializer):
    plan = serializers.CharField(
        required=False,
        allow_blank=True,
        allow_null=True,
        max_length=20,
        help_text=(
            "a release plan's id: the candidate takes the traffic in its steps; absent: the deployment's "
            "default plan (as the approval form preselects), all at once where it has none; null or "
            "empty: all at once"
        ),
    )


class PromotionApproveApi(PersonApi):
    """Approve (not your own request): the release is queued; poll `GET releases/<id>`. With a
    plan the candidate takes its traffic in steps: follow `GET rollouts/<id>` (the answer's
    `rollout`). Without `plan`
    the deployment's default plan is taken, as on the page; `"plan": null` deploys all at once."""

    permission_classes = [IsAuthenticated]

    @extend_schema(request=ApproveSerializer, responses={202: OpenApiResponse(description="The queued release.")})
    def post(self, request, promotion_id: int):
        promotion = get_object_or_404(PromotionRequest, pk=promotion_id)
        data = ApproveSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if "plan" in data.validated_data:
            plan = release_plan_for_approval(deployment=promotion.deployment, plan_id=data.validated_data["plan"])
        else:
            # The same plan the page preselects and the notifications' approval takes.
            plan = release_plan_default(deployment=promotion.deployment)
        release = promotion_approve(
            promotion=promotion, user=request.user, comment=data.validated_data["comment"], plan=plan
        )
        return Response(release_as_dict(release_get(release_id=release.pk)), status=202)


class PromotionRejectApi(PersonApi):
    permission_classes = [IsAuthenticated]

    @extend_schema(request=CommentSerializer, responses={200: OpenApiResponse(description="The request.")})
    def post(self, request, promotion_id: int):
        promotion = get_object_or_404(PromotionRequest, pk=promotion_id)
        data = CommentSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        promotion_reject(promotion=promotion, user=request.user, comment=data.validated_data["comment"])
        return Response(promotion_as_dict(promotion_get(promotion_id=promotion_id)))


class PromotionWithdrawApi(PersonApi):
    @extend_schema(request=None, responses={200: OpenApiResponse(description="The request.")})
    def post(self, request, promotion_id: int):
        promotion_withdraw(promotion=get_object_or_404(PromotionRequest, pk=promotion_id), user=request.user)
        return Response(promotion_as_dict(promotion_get(promotion_id=promotion_id)))


class RollbackApi(PersonApi):
    """Return the deployment to the version that was live before the current one."""

    permission_classes = [IsAuthenticated]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "RollbackInput"

        reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")

    @extend_schema(request=InputSerializer, responses={202: OpenApiResponse(description="The queued release.")})
    def post(self, request, deployment: str):
        target = get_object_or_404(Deployment, name=deployment)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        release = rollback_request(deployment=target, user=request.user, reason=data.validated_data["reason"])
        return Response(release_as_dict(release_get(release_id=release.pk)), status=202)


class ReleaseDetailApi(PersonApi):
    @extend_schema(responses={200: OpenApiResponse(description="The release and its step timings.")})
    def get(self, request, release_id: int):
        release = release_get(release_id=release_id)
        if release is None:
            return error_response(404, "release_id", "no such release")
        return Response(release_as_dict(release))


class AuditLogApi(PersonApi):
    """The audit log, newest first: its events and every move of a deployment's live
    pointer (`action` `live_switched`: who, why in `detail`, how in `data.kind`; no event `id`,
    its row of the trail in `live_change`). Page with `before=<next_before>`: an event's id,
    or `live-<id>` where the page ended on a move."""

    permission_classes = [IsAuthenticated, needs("training.view_auditevent")]

    @extend_schema(
        parameters=[
            OpenApiParameter("deployment", str, required=False),
            OpenApiParameter("before", str, required=False, description="the previous page's next_before"),
            OpenApiParameter("limit", int, required=False, description="1-500, default 100"),
        ],
        responses={200: OpenApiResponse(description="Audit events.")},
    )
    def get(self, request):
        deployment = None
        if request.query_params.get("deployment"):
            deployment = Deployment.objects.filter(name=request.query_params["deployment"]).first()
            if deployment is None:
                return error_response(400, "deployment", "no deployment of that name")
        before = None
        if request.query_params.get("before"):
            before = audit_cursor(request.query_params["before"])
            if before is None:
                return error_response(400, "before", "an event id from this list")
        limit = limit_param(request.query_params, default=100, maximum=500)
        events = audit_trail(deployment=deployment, before=before, limit=limit)
        return Response(
            {
                "events": [audit_as_dict(e) for e in events],
                "next_before": audit_cursor_text(events[-1]) if len(events) == limit else None,
            }
        )
