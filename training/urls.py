from django.urls import path

from training import views
from training.learning_policies import views as policy_views
from training.policy_notes import views as note_views

app_name = "training"
urlpatterns = [
    path("training/jobs/", views.job_list, name="job-list"),
    path("training/jobs/<int:job_id>/", views.job_detail, name="job-detail"),
    path("training/jobs/<int:job_id>/cancel", views.job_cancel, name="job-cancel"),
    path("training/sets/", views.training_set_build, name="set-build"),
    path("training/sets/episodes", views.training_set_build_episodes, name="set-build-episodes"),
    path("training/sets/<int:set_id>/", views.training_set_detail, name="set-detail"),
    path(
        "failure-modes/clusters/<int:cluster_id>/evaluation-slice",
        views.failure_cluster_slice,
        name="failure-cluster-slice",
    ),
    path("judge/notes/", note_views.policy_note_list, name="policy-notes"),
    path("judge/notes/<int:note_id>/", note_views.policy_note_detail, name="policy-note"),
    path("judge/notes/<int:note_id>/edit", note_views.policy_note_edit_view, name="policy-note-edit"),
    path("judge/notes/<int:note_id>/approve", note_views.policy_note_approve_view, name="policy-note-approve"),
    path("training/policies/", policy_views.policy_list, name="policy-list"),
    path("training/policies/<int:policy_id>/", policy_views.policy_detail, name="policy-detail"),
]
