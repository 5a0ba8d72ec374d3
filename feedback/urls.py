from django.urls import path

from feedback.views import traces

app_name = "feedback"
urlpatterns = [
    path("traces/", traces.trace_list, name="trace-list"),
]
