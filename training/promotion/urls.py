from django.urls import path

from training.promotion import rollout_views, views

app_name = "promotion"
urlpatterns = [
    path("models/", views.models_overview, name="models"),
    path("evaluations/new", views.evaluation_create_view, name="evaluation-create"),
    path("evaluations/<int:evaluation_id>/", views.evaluation_detail, name="evaluation"),
    path("evaluations/<int:evaluation_id>/items/<int:position>/", views.evaluation_item_detail, name="evaluation-item"),
    path("evaluations/<int:evaluation_id>/cancel", views.evaluation_cancel_view, name="evaluation-cancel"),
    path("promotions/", views.promotion_list, name="promotion-list"),
    path("promotions/new", views.promotion_new, name="promotion-new"),
    path("promotions/<int:promotion_id>/", views.promotion_detail, name="promotion"),
    path("promotions/<int:promotion_id>/approve", views.promotion_approve_view, name="promotion-approve"),
    path("promotions/<int:promotion_id>/reject", views.promotion_reject_view, name="promotion-reject"),
    path("promotions/<int:promotion_id>/withdraw", views.promotion_withdraw_view, name="promotion-withdraw"),
    path("deployments/<str:deployment>/rollback", views.rollback_view, name="rollback"),
    path("rollouts/<int:rollout_id>/", rollout_views.rollout_detail, name="rollout"),
    path("rollouts/<int:rollout_id>/<str:action>", rollout_views.rollout_action_view, name="rollout-action"),
    path("audit/", views.audit_log, name="audit"),
]
