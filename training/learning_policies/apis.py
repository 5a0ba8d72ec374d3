"""The learning policies API (`/api/v1/learning-policies/`): list, create, read with its runs,
and change a policy. It acts for a person (a session, or HTTP Basic with their own login)
as the other training APIs do: `view_learningpolicy` to read, `add_` to create, `change_`
to edit. The person who creates a policy answers for the promotion requests it opens."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import SAFE_METHODS, IsAuthenticated
from rest_framework.response import Response

from training.api_person import PersonApi, needs
from training.learning_policies.models import PolicySignal
from training.learning_policies.selectors import learning_policy_get, learning_policy_list, policy_as_dict
from training.learning_policies.services import (
    PolicyError,
    learning_policy_create,
    learning_policy_refs,
    learning_policy_update,
)
from training.models import JobKind
from training.serving.models import Deployment
from webapp.kernel.api_errors import error_response
from webapp.kernel.chat_format import MAX_JSON_DEPTH, json_depth

VIEW = "training.view_learningpolicy"
ADD = "training.add_learningpolicy"
CHANGE = "training.change_learningpolicy"
REFS = ("deployment", "eval_training_set", "notify_group", "notify_user")


class PolicyInputSerializer(serializers.Serializer):
    class Meta:
        ref_name = "LearningPolicyIn"

    name = serializers.CharField(max_length=100)
    enabled = serializers.BooleanField(required=False)
    signal = serializers.ChoiceField(choices=PolicySignal.choices, required=False)
    environment = serializers.CharField(max_length=100, required=False, allow_blank=True)
    min_new_turns = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False)
    min_interval_minutes = serializers.IntegerField(min_value=0, max_value=525_600, required=False)
    # Not "episodes": a policy trains on the set it builds.
    job_kind = serializers.ChoiceField(choices=[c for c in JobKind.choices if c[0] != JobKind.EPISODES], required=False)
    job_config = serializers.DictField(required=False, help_text="the job's settings, as on the jobs page")
    heldout_fraction = serializers.FloatField(required=False)
    eval_training_set = serializers.CharField(
        required=False, allow_blank=True, help_text="id of a set whose held-out items evaluate (blank: the run's own)"
    )
    eval_environment = serializers.CharField(max_length=100, required=False, allow_blank=True)
    eval_environment_split = serializers.CharField(max_length=20, required=False, allow_blank=True)
    eval_environment_tasks = serializers.IntegerField(min_value=1, max_value=10_000, required=False, allow_null=True)
    min_win_rate = serializers.FloatField(required=False)
    min_win_rate_ci_low = serializers.FloatField(required=False, allow_null=True)
    require_no_regressions = serializers.BooleanField(required=False)
    require_monitors_clean = serializers.BooleanField(required=False)
    notify_group = serializers.CharField(required=False, allow_blank=True, help_text="a group's name")
    notify_user = serializers.CharField(required=False, allow_blank=True, help_text="a username")


class PolicyCreateSerializer(PolicyInputSerializer):
    class Meta:
        ref_name = "LearningPolicyCreateIn"

    deployment = serializers.CharField(help_text="the deployment's name")


class PolicyUpdateSerializer(PolicyInputSerializer):
    class Meta:
        ref_name = "LearningPolicyUpdateIn"

    name = serializers.CharField(max_length=100, required=False)


def _values(request, serializer_class) -> dict[str, Any]:
    if isinstance(request.data, dict) and json_depth(request.data.get("job_config")) > MAX_JSON_DEPTH:
        raise PolicyError([("job_config", f"nested more than {MAX_JSON_DEPTH} levels deep")])
    data = serializer_class(data=request.data)
    if isinstance(request.data, dict):
        # A misspelt requirement must not pass for one that was set.
        unknown = sorted(str(k)[:100] for k in request.data if k not in data.fields)
        if unknown:
            raise PolicyError([(k, "unknown field (or one that cannot be changed)") for k in unknown])
    data.is_valid(raise_exception=True)
    given = dict(data.validated_data)
    refs = learning_policy_refs(**{k: given.pop(k) for k in REFS if k in given})
    return given | refs


class LearningPoliciesApi(PersonApi):
    """GET: every policy (of one deployment), with its latest run's id. POST: create one."""

    def get_permissions(self):
        return [IsAuthenticated(), needs(VIEW if self.request.method in SAFE_METHODS else ADD)()]

    @extend_schema(
        operation_id="v1_learning_policies_list",
        parameters=[OpenApiParameter("deployment", str, description="only this deployment's policies")],
        responses={200: OpenApiResponse(description="{'results': [policies]}")},
    )
    def get(self, request):
        deployment_id = None
        if request.query_params.get("deployment"):
            name = request.query_params["deployment"]
            deployment = None if "\x00" in name else Deployment.objects.filter(name=name).first()
            if deployment is None:
                return error_response(400, "deployment", f"no deployment {request.query_params['deployment'][:100]!r}")
            deployment_id = deployment.pk
        rows = learning_policy_list(deployment_id=deployment_id)
        return Response(
            {"results": [policy_as_dict(p) | {"latest_run": p.latest.pk if p.latest else None} for p in rows]}
        )

    @extend_schema(
        request=PolicyCreateSerializer,
        responses={
            201: OpenApiResponse(description="The policy."),
            400: OpenApiResponse(description="Field and reason."),
        },
    )
    def post(self, request):
        values = _values(request, PolicyCreateSerializer)
        policy = learning_policy_create(user=request.user, **values)
        return Response(policy_as_dict(policy, runs=[]), status=201)


class LearningPolicyDetailApi(PersonApi):
    """GET: the policy with its latest runs (each with its evidence). PATCH: change fields."""

    def get_permissions(self):
        return [IsAuthenticated(), needs(VIEW if self.request.method in SAFE_METHODS else CHANGE)()]

    @extend_schema(responses={200: OpenApiResponse(description="The policy and its runs, newest first.")})
    def get(self, request, policy_id: int):
        policy = learning_policy_get(policy_id=policy_id)
        if policy is None:
            return error_response(404, "policy", f"no learning policy {policy_id}")
        return Response(policy_as_dict(policy, runs=policy.recent_runs))

    @extend_schema(
        request=PolicyUpdateSerializer,
        responses={
            200: OpenApiResponse(description="The policy."),
            400: OpenApiResponse(description="Field and reason."),
        },
    )
    def patch(self, request, policy_id: int):
        policy = learning_policy_get(policy_id=policy_id)
        if policy is None:
            return error_response(404, "policy", f"no learning policy {policy_id}")
        values = _values(request, PolicyUpdateSerializer)
        learning_policy_update(policy=policy, user=request.user, **values)
        policy = learning_policy_get(policy_id=policy_id)
        return Response(policy_as_dict(policy, runs=policy.recent_runs))
