"""Operators' words over the API: a trace's comments (read and write) and a person's rating of
a turn (`/api/v1/traces/<id>/comments`, `/api/v1/traces/<id>/ratings`).

Writing is for people (a login session, or HTTP Basic with one's own login) with the page's
permissions — comments are what a person said, never a deployment key's. Reading the comments
also takes a key with the `read` scope, for its own deployment's traces.
"""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.authentication import SessionAuthentication
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from feedback.auth import ApiKeyAuthentication, ApiKeyPrincipal
from feedback.models import ApiKeyScope, Comment, Message, RatingKind, Trace
from feedback.permissions import ANNOTATE, can_see_trace
from feedback.selectors import trace_visible_to
from feedback.services.review import comment_add, turn_rating_clear, turn_rating_set
from webapp.kernel.api_errors import error_response
from webapp.kernel.auth import ThrottledBasicAuthentication
from webapp.kernel.chat_format import FieldError

RATE = "feedback.add_turnrating"


def comment_as_dict(c: Comment) -> dict[str, Any]:
    return {
        "id": c.pk,
        "position": c.message.position,
        "author": c.author.username if c.author_id else None,
        "body": c.body,
        "quote": c.quote,
        "quote_start": c.quote_start,
        "quote_end": c.quote_end,
        "resolved": c.resolved_at is not None,
        "created_at": c.created_at.isoformat(),
    }


def _trace_for(request, trace_id: int) -> Trace:
    trace = get_object_or_404(trace_visible_to(request.user), pk=trace_id)
    if not isinstance(request.user, ApiKeyPrincipal) and not can_see_trace(request.user, trace):
        raise PermissionDenied("you cannot see this trace")
    return trace


def _turn(trace: Trace, position: int) -> Message:
    return get_object_or_404(Message, trace=trace, position=position)


class _KeyReadsPersonSees(BasePermission):
    """A key needs the `read` scope; a person only to be logged in: whether they may see the
    trace is the page's rule (`can_see_trace`: a reviewer, the traces of queue items held)."""

    message = "this API key lacks the 'read' scope"

    def has_permission(self, request, view) -> bool:
        user = request.user
        if isinstance(user, ApiKeyPrincipal):
            return user.has_scope(ApiKeyScope.READ)
        return bool(user and user.is_authenticated)


class _PersonWrites(APIView):
    authentication_classes = [ApiKeyAuthentication, SessionAuthentication, ThrottledBasicAuthentication]
    permission_classes = [_KeyReadsPersonSees]

    def _person(self, request, permission: str) -> Response | None:
        if isinstance(request.user, ApiKeyPrincipal):
            return error_response(403, "Authorization", "a person writes this, with their own login; not an API key")
        if not request.user.has_perm(permission):
            return error_response(403, "", f"your role does not include {permission}")
        return None


class TraceCommentsApi(_PersonWrites):
    """GET: the trace's comments, oldest first. POST: comment on one of its turns."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "CommentIn"

        position = serializers.IntegerField(min_value=0, help_text="the message's position in the trace")
        body = serializers.CharField(help_text="what went wrong and what it should have done, in plain words")
        quote = serializers.CharField(required=False, allow_blank=True, default="")
        quote_start = serializers.IntegerField(required=False, min_value=0, allow_null=True, default=None)
        quote_end = serializers.IntegerField(required=False, min_value=0, allow_null=True, default=None)

    @extend_schema(operation_id="v1_trace_comments_list", responses={200: OpenApiResponse(description="{'results'}")})
    def get(self, request, trace_id: int):
        trace = _trace_for(request, trace_id)
        comments = Comment.objects.filter(trace=trace).select_related("message", "author").order_by("created_at", "id")
        return Response({"results": [comment_as_dict(c) for c in comments[:1000]]})

    @extend_schema(
        operation_id="v1_trace_comments_create",
        request=InputSerializer,
        responses={201: OpenApiResponse(description="The comment.")},
    )
    def post(self, request, trace_id: int):
        refused = self._person(request, ANNOTATE)
        if refused is not None:
            return refused
        trace = _trace_for(request, trace_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        given = data.validated_data
        comment = comment_add(
            message=_turn(trace, given["position"]),
            author=request.user,
            body=given["body"],
            quote=given["quote"],
            quote_start=given["quote_start"],
            quote_end=given["quote_end"],
        )
        return Response(comment_as_dict(comment), status=201)


class TraceRatingsApi(_PersonWrites):
    """POST: rate one of the trace's assistant turns — "up"/"down" (thumbs), 1-5 (score) or
    "clear" — as the person sending it; a second rating replaces the first."""

    class InputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "TurnRatingIn"

        position = serializers.IntegerField(min_value=0)
        rating = serializers.CharField(help_text='"up", "down", "1"-"5" or "clear"')

    @extend_schema(
        operation_id="v1_trace_ratings_create",
        request=InputSerializer,
        responses={200: OpenApiResponse(description="The rating as stored.")},
    )
    def post(self, request, trace_id: int):
        refused = self._person(request, RATE)
        if refused is not None:
            return refused
        trace = _trace_for(request, trace_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        message = _turn(trace, data.validated_data["position"])
        value = data.validated_data["rating"].strip()
        if value == "clear":
            turn_rating_clear(message=message, user=request.user)
            return Response({"position": message.position, "rating": None})
        kind = RatingKind.THUMBS if value in ("up", "down") else RatingKind.SCORE
        try:
            rating = turn_rating_set(message=message, user=request.user, kind=kind, value=value)
        except FieldError as exc:  # named by the service's words for them: say the request's
            raise FieldError("position" if exc.field == "message" else "rating", exc.reason) from None
        return Response({"position": message.position, "kind": rating.kind, "value": rating.value})
