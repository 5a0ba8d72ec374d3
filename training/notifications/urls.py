from django.urls import path

from training.notifications import views

app_name = "notifications"
urlpatterns = [
    path("notifications/", views.notifications, name="list"),
    path("notifications/promotions/<int:promotion_id>/approve", views.notification_approve, name="approve"),
    path("notifications/promotions/<int:promotion_id>/reject", views.notification_reject, name="reject"),
]
