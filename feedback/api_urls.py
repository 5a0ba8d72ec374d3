from django.urls import path

from feedback import apis, apis_judge

urlpatterns = [
    path("traces", apis.TraceIngestApi.as_view(), name="api-trace-ingest"),
    path("traces/<int:trace_id>", apis.TraceDetailApi.as_view(), name="api-trace-detail"),
]
urlpatterns += [
    path("feedback", apis.FeedbackCreateApi.as_view(), name="api-feedback-create"),
    path("feedback/links", apis.FeedbackLinkCreateApi.as_view(), name="api-feedback-link-create"),
    path("feedback/links/<str:token>", apis.FeedbackLinkPostApi.as_view(), name="api-feedback-link-post"),
]
urlpatterns += [
    path("judge/agreement", apis_judge.JudgeAgreementApi.as_view(), name="api-judge-agreement"),
    path("traces/<int:trace_id>/judgements", apis_judge.TraceJudgementsApi.as_view(), name="api-trace-judgements"),
]
