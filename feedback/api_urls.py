from django.urls import path

from feedback import apis

urlpatterns = [
    path("traces", apis.TraceIngestApi.as_view(), name="api-trace-ingest"),
    path("traces/<int:trace_id>", apis.TraceDetailApi.as_view(), name="api-trace-detail"),
]
