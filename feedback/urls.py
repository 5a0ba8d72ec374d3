from django.urls import path, re_path

from feedback.views import links, queues, review, traces

app_name = "feedback"
urlpatterns = [
    path("traces/", traces.trace_list, name="trace-list"),
    path("traces/<int:trace_id>/", traces.trace_detail, name="trace-detail"),
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
    path("queues/<int:queue_id>/items/<int:item_id>/", queues.queue_item, name="queue-item"),
    re_path(
        r"^queues/(?P<queue_id>\d+)/items/(?P<item_id>\d+)/(?P<action>done|skip)$",
        queues.queue_item_action,
        name="queue-item-action",
    ),
    path("f/<str:token>", links.feedback_link_page, name="feedback-link"),
]
