from django.urls import path, re_path

from feedback.failure_modes import views as failure_modes
from feedback.views import judge, links, queues, review, traces

app_name = "feedback"
urlpatterns = [
    path("traces/", traces.trace_list, name="trace-list"),
    path("traces/<int:trace_id>/", traces.trace_detail, name="trace-detail"),
    path("traces/<int:trace_id>/side", traces.trace_side, name="trace-side"),
    re_path(
        r"^traces/(?P<trace_id>\d+)/(?P<direction>next|prev)$", traces.trace_neighbour_view, name="trace-neighbour"
    ),
    path("traces/<int:trace_id>/messages/<int:position>/content", traces.message_content, name="message-content"),
    path("traces/<int:trace_id>/messages/<int:position>/raw", traces.message_raw, name="message-raw"),
    path("traces/<int:trace_id>/messages/<int:position>/comments", review.comment_create_view, name="comment-create"),
    path("traces/<int:trace_id>/messages/<int:position>/rating", review.rating_view, name="turn-rating"),
    path("traces/<int:trace_id>/messages/<int:position>/correction", review.correction_editor, name="correction-edit"),
    path("comments/<int:comment_id>/edit", review.comment_edit_view, name="comment-edit"),
    path("comments/<int:comment_id>/delete", review.comment_delete_view, name="comment-delete"),
    path("comments/<int:comment_id>/resolve", review.comment_resolve_view, name="comment-resolve"),
    path("corrections/<int:correction_id>/delete", review.correction_delete_view, name="correction-delete"),
    path("queues/", queues.queue_list, name="queue-list"),
    path("queues/new", queues.queue_create_view, name="queue-create"),
    path("queues/<int:queue_id>/", queues.queue_detail, name="queue-detail"),
    path("queues/<int:queue_id>/next", queues.queue_next, name="queue-next"),
    path("queues/<int:queue_id>/rubric", queues.queue_rubric_edit, name="queue-rubric"),
    path("queues/<int:queue_id>/items/<int:item_id>/scores", queues.queue_item_scores, name="queue-item-scores"),
    path("queues/<int:queue_id>/items/<int:item_id>/", queues.queue_item, name="queue-item"),
    re_path(
        r"^queues/(?P<queue_id>\d+)/items/(?P<item_id>\d+)/(?P<action>done|skip)$",
        queues.queue_item_action,
        name="queue-item-action",
    ),
    path("f/<str:token>", links.feedback_link_page, name="feedback-link"),
]
urlpatterns += [
    path("judge/", judge.judge_overview, name="judge"),
    path("judge/jobs", judge.judge_job_create_view, name="judge-job-create"),
    path("judge/jobs/<int:job_id>/cancel", judge.judge_job_cancel_view, name="judge-job-cancel"),
    path("judge/results/<int:result_id>/", judge.judge_result_detail, name="judge-result"),
    path("judge/agreement/", judge.judge_agreement, name="judge-agreement"),
    path(
        "judge/deployments/<int:deployment_id>/correction-mode",
        judge.deployment_judge_mode_view,
        name="deployment-judge-mode",
    ),
    path("traces/<int:trace_id>/messages/<int:position>/judge", judge.judge_turn_view, name="judge-turn"),
    path("traces/<int:trace_id>/messages/<int:position>/judgement", judge.judge_turn_status, name="judge-turn-status"),
    path("failure-modes/", failure_modes.failure_modes, name="failure-modes"),
    path("failure-modes/runs", failure_modes.failure_mode_run_create_view, name="failure-mode-run-create"),
    path(
        "failure-modes/clusters/<int:cluster_id>/rename",
        failure_modes.failure_cluster_rename_view,
        name="failure-cluster-rename",
    ),
    path(
        "failure-modes/clusters/<int:cluster_id>/dismiss",
        failure_modes.failure_cluster_dismiss_view,
        name="failure-cluster-dismiss",
    ),
    path(
        "failure-modes/clusters/<int:cluster_id>/queue",
        failure_modes.failure_cluster_queue_view,
        name="failure-cluster-queue",
    ),
]
