from django.urls import path

from feedback import views

app_name = "feedback"
urlpatterns = [
    path("traces/", views.trace_list, name="trace-list"),
]
