"""The policy notes API (`/api/v1/policy-notes...`), one class per operation. It acts for
a person (a session, or HTTP Basic with their login): approving means someone decided.
Bad input is a 400 naming the field; approving without the approver role a 403; approving
a version that is not the latest, or is already approved, a 409; a judge that gave no
usable note a 502."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from feedback.models import PolicyNote
from training.api_person import PersonApi, needs
from training.policy_notes.selectors import policy_note_as_dict, policy_note_get, policy_notes
from training.policy_notes.services import (
    MAX_COMMENTS,
    MIN_COMMENTS,
    PROPOSE,
    policy_note_approve,
    policy_note_edit,
    policy_note_propose,
)
from training.serving.models import Deployment
from webapp.kernel.api_errors import error_response

VIEW = "feedback.view_trace"  # a note shows operators' comments


class PolicyNoteListApi(PersonApi):
    permission_classes = [IsAuthenticated, needs(VIEW)]

    @extend_schema(
        operation_id="policy_notes_list",
        parameters=[OpenApiParameter("deployment", str, required=False, description="a deployment name")],
        responses={200: OpenApiResponse(description="Notes, newest first, each with its versions.")},
    )
    def get(self, request):
        deployment = None
        if request.query_params.get("deployment"):
            deployment = Deployment.objects.filter(name=request.query_params["deployment"]).first()
            if deployment is None:
                return error_response(400, "deployment", "no deployment of that name")
        return Response({"notes": [policy_note_as_dict(n) for n in policy_notes(deployment=deployment)[:100]]})


class PolicyNoteDetailApi(PersonApi):
    permission_classes = [IsAuthenticated, needs(VIEW)]

    @extend_schema(
        operation_id="policy_note_detail",
        responses={200: OpenApiResponse(description="The note with its versions, newest first.")},
    )
    def get(self, request, note_id: int):
        note = policy_note_get(note_id=note_id)
        if note is None:
            return error_response(404, "note_id", "no policy note of that id")
        return Response(policy_note_as_dict(note))


class PolicyNoteProposeApi(PersonApi):
    """The deployment's judge reads its comments (the given ones, else the latest `limit`)
    and proposes a note; it is stored unapproved."""

    permission_classes = [IsAuthenticated, needs(VIEW), needs(PROPOSE)]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "PolicyNoteProposeInput"

        deployment = serializers.SlugRelatedField(slug_field="name", queryset=Deployment.objects.all())
        comment_ids = serializers.ListField(
            child=serializers.IntegerField(min_value=1), required=False, max_length=MAX_COMMENTS
        )
        limit = serializers.IntegerField(min_value=MIN_COMMENTS, max_value=MAX_COMMENTS, required=False)

    @extend_schema(request=InputSerializer, responses={201: OpenApiResponse(description="The proposed note.")})
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        note = policy_note_propose(
            deployment=v["deployment"],
            requested_by=request.user,
            comment_ids=v.get("comment_ids"),
            limit=v.get("limit", MAX_COMMENTS),
        )
        return Response(policy_note_as_dict(policy_note_get(note_id=note.pk)), status=201)


class PolicyNoteEditApi(PersonApi):
    """A new version of the note; the approved one stays in use until this one is approved."""

    permission_classes = [IsAuthenticated, needs(VIEW), needs(PROPOSE)]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "PolicyNoteEditInput"

        text = serializers.CharField(max_length=2000)
        rule = serializers.JSONField(required=False, allow_null=True, help_text="null: the rule in words only")

    @extend_schema(request=InputSerializer, responses={201: OpenApiResponse(description="The note.")})
    def post(self, request, note_id: int):
        note = get_object_or_404(PolicyNote, pk=note_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        policy_note_edit(note=note, text=v["text"], rule=v.get("rule"), user=request.user)
        return Response(policy_note_as_dict(policy_note_get(note_id=note.pk)), status=201)


class PolicyNoteApproveApi(PersonApi):
    """Approve the note's latest version (the approver role): the judge reads it from now on."""

    permission_classes = [IsAuthenticated]

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "PolicyNoteApproveInput"

        version = serializers.IntegerField(min_value=1, help_text="the version read, which must be the latest")

    @extend_schema(request=InputSerializer, responses={200: OpenApiResponse(description="The note.")})
    def post(self, request, note_id: int):
        note = get_object_or_404(PolicyNote, pk=note_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        policy_note_approve(note=note, number=data.validated_data["version"], user=request.user)
        return Response(policy_note_as_dict(policy_note_get(note_id=note.pk)))
