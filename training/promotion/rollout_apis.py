"""The API of progressive releases: read one, and hold, resume, advance or roll it back; the
same services as the release page's buttons (`training.promotion.services.rollouts`)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from training.api_person import PersonApi, needs
from training.promotion.rollout_models import Rollout
from training.promotion.rollout_views import ACTIONS, JOINS
from webapp.kernel.api_errors import error_response


def rollout_as_dict(rollout: Rollout) -> dict:
    return {
        "id": rollout.pk,
        "deployment": rollout.deployment.name,
        "candidate": rollout.candidate.name,
        "baseline": rollout.baseline.name,
        "promotion": rollout.promotion_id,
        "state": rollout.state,
        "step": rollout.step,
        "share": rollout.share,
        "plan": {k: rollout.plan.get(k) for k in ("name", "steps", "thresholds")},
        "reason": rollout.reason,
        "checked_at": rollout.checked_at,
        "last_check": rollout.last_check,
        "changes": [
            {
                "at": c.at,
                "by": c.actor_name,
                "from_state": c.from_state,
                "to_state": c.to_state,
                "from_share": c.from_share,
                "to_share": c.to_share,
                "reason": c.reason,
            }
            for c in rollout.changes.all()
        ],
    }


def _get(rollout_id: int) -> Rollout:
    return get_object_or_404(Rollout.objects.select_related(*JOINS), pk=rollout_id)


class RolloutDetailApi(PersonApi):
    """A progressive release: its plan, step, state, last check and every change."""

    permission_classes = [IsAuthenticated, needs("training.view_auditevent")]

    @extend_schema(responses={200: OpenApiResponse(description="The progressive release.")})
    def get(self, request, rollout_id: int):
        return Response(rollout_as_dict(_get(rollout_id)))


class RolloutActionApi(PersonApi):
    """Hold, resume, advance or roll back (`action`); `reason` is kept in its change log.
    `step` (and or `share`) is where you saw the release (`GET rollouts/<id>`): a hold, resume
    or advance is refused (409, naming it) where the release has moved since. Advance needs it."""

    permission_classes = [IsAuthenticated]  # the service names the permission it needs

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "RolloutActionInput"

        reason = serializers.CharField(
            required=False, allow_blank=True, max_length=500, default="", help_text="why, kept in its change log"
        )
        step = serializers.IntegerField(
            required=False, min_value=0, max_value=100, help_text="the step you saw (`step` of GET rollouts/<id>)"
        )
        share = serializers.FloatField(
            required=False, min_value=0, max_value=1, help_text="the candidate's share you saw, 0 to 1"
        )

    @extend_schema(request=InputSerializer, responses={200: OpenApiResponse(description="The progressive release.")})
    def post(self, request, rollout_id: int, action: str):
        act = ACTIONS.get(action)
        if act is None:
            return error_response(404, "action", "one of hold, resume, advance, rollback")
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        if action == "advance" and v.get("step") is None and v.get("share") is None:
            return error_response(400, "step", "the step you saw (GET rollouts/<id>): a move since is refused")
        rollout = act(
            rollout=_get(rollout_id),
            user=request.user,
            reason=v["reason"],
            seen_step=v.get("step"),
            seen_share=v.get("share"),
        )
        return Response(rollout_as_dict(_get(rollout.pk)))
