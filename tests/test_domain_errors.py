"""Domain errors reach an API caller through the one DRF exception handler, with their status
and the field they name, whatever the view."""

from __future__ import annotations

import pytest
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

from feedback.services.customer_feedback import (
    FeedbackLinkError,
    FeedbackLinkUsed,
    FeedbackTargetNotFound,
    IdempotencyConflict,
)
from training.promotion.services.evaluation_items import EvaluationError
from training.promotion.services.promotion_checks import PromotionRefused
from training.services.jobs import JobError
from training.services.judge_gate import OVERRIDE_FIELD, JudgeGateClosed
from webapp.kernel.api_errors import error_response, exception_handler
from webapp.kernel.chat_format import FieldError
from webapp.kernel.errors import Conflict, DomainError


class QuotaSpent(DomainError):
    """A kind of refusal no API view knows about."""

    status = 429
    field = "quota"


def quota_spend(*, amount: int) -> None:
    raise QuotaSpent(f"{amount} is more than the 10 left")


class SpendApi(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    def post(self, request):
        quota_spend(amount=int(request.data["amount"]))
        return Response({"ok": True})


def test_a_new_domain_error_raised_in_a_service_surfaces_with_its_status_and_field():
    request = APIRequestFactory().post("/spend", {"amount": 12}, format="json")
    response = SpendApi.as_view()(request)
    assert response.status_code == 429
    assert response.data == {
        "detail": "quota: 12 is more than the 10 left",
        "errors": [{"field": "quota", "reason": "12 is more than the 10 left"}],
    }


@pytest.mark.parametrize(
    ("exc", "status", "errors", "message"),
    [
        (FieldError("rating", "up or down"), 400, [("rating", "up or down")], "rating: up or down"),
        (
            FeedbackTargetNotFound("trace_id", "no such trace"),
            404,
            [("trace_id", "no such trace")],
            "trace_id: no such trace",
        ),
        (
            IdempotencyConflict("used for a different request"),
            409,
            [("idempotency_key", "used for a different request")],
            None,
        ),
        (FeedbackLinkError("expired"), 403, [("token", "expired")], None),
        (FeedbackLinkUsed(), 409, [("token", str(FeedbackLinkUsed()))], None),
        (
            PromotionRefused("no finished evaluation", field="evaluation_id"),
            409,
            [("evaluation_id", "no finished evaluation")],
            None,
        ),
        (PromotionRefused("already live"), 409, [("", "already live")], None),
        (
            EvaluationError([("model_version", "required"), ("", "pick at least one item")]),
            400,
            [("model_version", "required"), ("", "pick at least one item")],
            "model_version: required; pick at least one item",
        ),
        (JobError([("kind", "one of sft, grpo")]), 400, [("kind", "one of sft, grpo")], "kind: one of sft, grpo"),
        (JudgeGateClosed("gate closed"), 400, [(OVERRIDE_FIELD, "gate closed")], f"{OVERRIDE_FIELD}: gate closed"),
    ],
)
def test_each_domain_error_keeps_its_status_field_and_message(exc, status, errors, message):
    assert isinstance(exc, DomainError)
    assert exc.status == status
    assert exc.errors == errors
    assert str(exc) == (message if message is not None else errors[0][1])
    assert exc.detail == "; ".join(f"{f}: {r}" if f else r for f, r in errors)


def test_value_errors_stay_value_errors():
    # Callers that catch ValueError around parsing still catch these.
    assert isinstance(FieldError("x", "y"), ValueError)
    assert isinstance(EvaluationError([("x", "y")]), ValueError)
    assert issubclass(PromotionRefused, Conflict)


@pytest.mark.parametrize(
    ("exc", "status", "field", "reason"),
    [
        # What feedback/apis.py and training/promotion/apis.py answered by hand before the handler did.
        (FieldError("rating", "up or down"), 400, "rating", "up or down"),
        (FeedbackTargetNotFound("trace_id", "no such trace"), 404, "trace_id", "no such trace"),
        (IdempotencyConflict("used for a different request"), 409, "idempotency_key", "used for a different request"),
        (FeedbackLinkError("expired"), 403, "token", "expired"),
        (FeedbackLinkUsed(), 409, "token", str(FeedbackLinkUsed())),
        (
            PromotionRefused("no finished evaluation", field="evaluation_id"),
            409,
            "evaluation_id",
            "no finished evaluation",
        ),
        (PromotionRefused("already live"), 409, "", "already live"),
    ],
)
def test_the_handler_answers_as_the_hand_translation_did(exc, status, field, reason):
    response = exception_handler(exc, {})
    expected = error_response(status, field, reason)
    assert (response.status_code, response.data) == (expected.status_code, expected.data)


def test_an_evaluation_error_keeps_every_field_in_the_body():
    exc = EvaluationError([("model_version", "required"), ("", "pick at least one item")])
    response = exception_handler(exc, {})
    assert response.status_code == 400
    assert response.data == {
        "detail": str(exc),
        "errors": [
            {"field": "model_version", "reason": "required"},
            {"field": "", "reason": "pick at least one item"},
        ],
    }
