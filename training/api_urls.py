from django.urls import path

from training import apis_jobs, apis_sets
from training.learning_policies import apis as policy_apis
from training.policy_notes import apis as note_apis
from training.promotion import apis, rollout_apis

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
    path("rollouts/<int:rollout_id>", rollout_apis.RolloutDetailApi.as_view(), name="api-rollout-detail"),
    path("rollouts/<int:rollout_id>/<str:action>", rollout_apis.RolloutActionApi.as_view(), name="api-rollout-action"),
    path("audit", apis.AuditLogApi.as_view(), name="api-audit-log"),
    path("jobs", apis_jobs.JobsApi.as_view(), name="api-jobs"),
    path("jobs/<int:job_id>", apis_jobs.JobDetailApi.as_view(), name="api-job-detail"),
    path("jobs/<int:job_id>/metrics", apis_jobs.JobMetricsApi.as_view(), name="api-job-metrics"),
    path("jobs/<int:job_id>/cancel", apis_jobs.JobCancelApi.as_view(), name="api-job-cancel"),
    path("models", apis_jobs.ModelVersionsApi.as_view(), name="api-model-versions"),
    path("training-sets", apis_sets.TrainingSetsApi.as_view(), name="api-training-sets"),
    path("training-sets/<int:set_id>", apis_sets.TrainingSetDetailApi.as_view(), name="api-training-set-detail"),
    path(
        "training-sets/<int:set_id>/items.jsonl", apis_sets.TrainingSetItemsApi.as_view(), name="api-training-set-items"
    ),
    path(
        "training-sets/<int:set_id>/items.parquet",
        apis_sets.TrainingSetItemsParquetApi.as_view(),
        name="api-training-set-items-parquet",
    ),
    # Beside the failure modes' queue API (`feedback.api_urls`): a cluster's evaluation slice.
    path(
        "failure-modes/clusters/<str:cluster_id>/evaluation-slice",
        apis_sets.FailureClusterSliceApi.as_view(),
        name="api-failure-cluster-slice",
    ),
    path("policy-notes", note_apis.PolicyNoteListApi.as_view(), name="api-policy-notes"),
    path("policy-notes/propose", note_apis.PolicyNoteProposeApi.as_view(), name="api-policy-note-propose"),
    path("policy-notes/<int:note_id>", note_apis.PolicyNoteDetailApi.as_view(), name="api-policy-note-detail"),
    path("policy-notes/<int:note_id>/versions", note_apis.PolicyNoteEditApi.as_view(), name="api-policy-note-edit"),
    path(
        "policy-notes/<int:note_id>/approve", note_apis.PolicyNoteApproveApi.as_view(), name="api-policy-note-approve"
    ),
    path("learning-policies/", policy_apis.LearningPoliciesApi.as_view(), name="api-learning-policies"),
    path(
        "learning-policies/<int:policy_id>/",
        policy_apis.LearningPolicyDetailApi.as_view(),
        name="api-learning-policy-detail",
    ),
]
