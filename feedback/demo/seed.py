"""Operator comments the demo seeds on the agent's tracking answers (what an operator
would write; the judge turns these words into rewards and corrections)."""

from __future__ import annotations

import time

from django.contrib.auth import get_user_model

from feedback.models import Message, MessageRole, Trace
from feedback.services.review import comment_add


def demo_operator_comments_add(
    *, deployment: str, comments: list[tuple[str, str]], author: str, wait_s: float = 20.0
) -> int:
    """Add each `(trace external id, body)` comment, as `author`, to the trace's last
    assistant turn; returns how many were added. The gateway stores traces off the
    response path, so a trace not written yet is waited for up to `wait_s` seconds."""
    user = get_user_model().objects.get(username=author)
    added = 0
    deadline = time.monotonic() + wait_s
    for external_id, body in comments:
        while True:
            message = (
                Message.objects.filter(
                    trace__deployment__name=deployment, trace__external_id=external_id, role=MessageRole.ASSISTANT
                )
                .order_by("-position")
                .first()
            )
            if message is not None or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if message is None:
            continue
        if Trace.objects.filter(pk=message.trace_id, comments__body=body).exists():
            continue
        comment_add(message=message, author=user, body=body)
        added += 1
    return added
