"""The feedback app's models, by sub-domain; import them from here."""

from feedback.models.queues import AnnotationQueue, QueueItem, QueueItemStatus, QueueSkip
from feedback.models.review import (
    Comment,
    Correction,
    CustomerFeedback,
    FeedbackSource,
    RatingKind,
    TraceFlag,
    TurnRating,
    rating_normalised,
    rating_sentiment,
)
from feedback.models.traces import (
    ApiKey,
    ApiKeyScope,
    Deployment,
    Message,
    MessageRole,
    Trace,
    TraceSource,
    TraceStatus,
)

__all__ = [
    "AnnotationQueue",
    "ApiKey",
    "ApiKeyScope",
    "Comment",
    "Correction",
    "CustomerFeedback",
    "Deployment",
    "FeedbackSource",
    "Message",
    "MessageRole",
    "QueueItem",
    "QueueItemStatus",
    "QueueSkip",
    "RatingKind",
    "Trace",
    "TraceFlag",
    "TraceSource",
    "TraceStatus",
    "TurnRating",
    "rating_normalised",
    "rating_sentiment",
]
