from django.urls import path

from training import apis

urlpatterns = [
    path("evaluations", apis.EvaluationCreateApi.as_view(), name="api-evaluation-create"),
    path("evaluations/<int:evaluation_id>", apis.EvaluationDetailApi.as_view(), name="api-evaluation-detail"),
    path("evaluations/<int:evaluation_id>/cancel", apis.EvaluationCancelApi.as_view(), name="api-evaluation-cancel"),
    path("promotions", apis.PromotionRequestsApi.as_view(), name="api-promotions"),
    path("promotions/<int:promotion_id>", apis.PromotionRequestDetailApi.as_view(), name="api-promotion-detail"),
    path("promotions/<int:promotion_id>/approve", apis.PromotionApproveApi.as_view(), name="api-promotion-approve"),
    path("promotions/<int:promotion_id>/reject", apis.PromotionRejectApi.as_view(), name="api-promotion-reject"),
    path("promotions/<int:promotion_id>/withdraw", apis.PromotionWithdrawApi.as_view(), name="api-promotion-withdraw"),
    path("deployments/<str:deployment>/rollback", apis.RollbackApi.as_view(), name="api-deployment-rollback"),
    path("releases/<int:release_id>", apis.ReleaseDetailApi.as_view(), name="api-release-detail"),
    path("audit", apis.AuditLogApi.as_view(), name="api-audit-log"),
]
