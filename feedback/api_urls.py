from django.urls import path

from feedback import apis

urlpatterns = [
    path("traces", apis.TraceIngestApi.as_view(), name="api-trace-ingest"),
    path("traces/<int:trace_id>", apis.TraceDetailApi.as_view(), name="api-trace-detail"),
]
urlpatterns += [
    path("feedback", apis.FeedbackCreateApi.as_view(), name="api-feedback-create"),
    path("feedback/links", apis.FeedbackLinkCreateApi.as_view(), name="api-feedback-link-create"),
    path("feedback/links/<str:token>", apis.FeedbackLinkPostApi.as_view(), name="api-feedback-link-post"),
]
