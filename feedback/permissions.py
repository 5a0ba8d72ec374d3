"""Who may do what in the dashboard; the roles are `webapp/kernel/roles.py`'s, and what they
may do in feedback `FeedbackConfig.roles` (feedback/apps.py) declares.

Reviewers hold no `view_trace`: they see a trace only while they hold its queue item, or
after they finished it.
"""

from __future__ import annotations

from django.db.models import Q
from django.utils import timezone

from feedback.models import QueueItem, QueueItemStatus, Trace

BROWSE = "feedback.view_trace"
ANNOTATE = "feedback.add_comment"
BUILD_QUEUE = "feedback.add_annotationqueue"
WORK_QUEUE = "feedback.work_annotationqueue"
VIEW_CUSTOMER_FEEDBACK = "feedback.view_customerfeedback"


def can_browse(user) -> bool:
    return user.is_authenticated and user.has_perm(BROWSE)


def can_annotate(user) -> bool:
    return user.is_authenticated and user.has_perm(ANNOTATE)


def can_see_customer_feedback(user) -> bool:
    """Customers' comments, corrections and references: operators and admins only."""
    return user.is_authenticated and user.has_perm(VIEW_CUSTOMER_FEEDBACK)


def can_see_trace(user, trace: Trace) -> bool:
    if can_browse(user):
        return True
    if not (user.is_authenticated and user.has_perm(WORK_QUEUE)):
        return False
    now = timezone.now()
    return QueueItem.objects.filter(
        Q(locked_by=user, locked_until__gt=now, status=QueueItemStatus.PENDING)
        | Q(done_by=user, status=QueueItemStatus.DONE),
        trace=trace,
    ).exists()
