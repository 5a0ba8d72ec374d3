from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from webapp.site import views

urlpatterns = [
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("tour/", views.tour, name="tour"),
    path("tour/<str:deployment>/agent-run", views.tour_agent_run, name="tour-agent-run"),
    path("overview/", views.overview, name="overview"),
    path("overview/<slug:deployment>/story/", views.deployment_story_view, name="deployment-story"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/v1/", include("feedback.api_urls")),
    path("api/v1/", include("training.api_urls")),
    path("api/openai/v1/", include("training.finetuning.urls")),
    path("", include("feedback.urls")),
    path("", include("training.urls")),
    path("", include("training.promotion.urls")),
    path("", include("training.notifications.urls")),
]
