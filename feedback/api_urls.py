from django.urls import path

from feedback import apis, apis_judge, apis_otlp, apis_review
from feedback.failure_modes import apis as apis_failure_modes

urlpatterns = [
    path("traces", apis.TraceIngestApi.as_view(), name="api-trace-ingest"),
    path("traces/<int:trace_id>", apis.TraceDetailApi.as_view(), name="api-trace-detail"),
    path("traces/export.jsonl", apis.TraceExportApi.as_view(), name="api-trace-export"),
    path("traces/export.parquet", apis.TraceExportParquetApi.as_view(), name="api-trace-export-parquet"),
    path("traces/<int:trace_id>/comments", apis_review.TraceCommentsApi.as_view(), name="api-trace-comments"),
    path("traces/<int:trace_id>/ratings", apis_review.TraceRatingsApi.as_view(), name="api-trace-ratings"),
    # OTLP/HTTP's fixed path under the exporter's OTEL_EXPORTER_OTLP_ENDPOINT (…/api/v1/otel).
    path("otel/v1/traces", apis_otlp.OtlpTracesApi.as_view(), name="api-otlp-traces"),
]
urlpatterns += [
    path("feedback", apis.FeedbackCreateApi.as_view(), name="api-feedback-create"),
    path("grades", apis.GradeCreateApi.as_view(), name="api-grade-create"),
    path("feedback/links", apis.FeedbackLinkCreateApi.as_view(), name="api-feedback-link-create"),
    path("feedback/links/<str:token>", apis.FeedbackLinkPostApi.as_view(), name="api-feedback-link-post"),
]
urlpatterns += [
    path("judge/agreement", apis_judge.JudgeAgreementApi.as_view(), name="api-judge-agreement"),
    path("traces/<int:trace_id>/judgements", apis_judge.TraceJudgementsApi.as_view(), name="api-trace-judgements"),
    path("deployments/<str:name>/judge", apis_judge.DeploymentJudgeApi.as_view(), name="api-deployment-judge"),
]
urlpatterns += [
    # The id is read by `parse_id`, so what is no id is a 400 naming it rather than a 404.
    path(
        "failure-modes/clusters/<str:cluster_id>/queue",
        apis_failure_modes.FailureClusterQueueApi.as_view(),
        name="api-failure-cluster-queue",
    ),
]
