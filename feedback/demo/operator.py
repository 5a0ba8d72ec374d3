"""The simulated operator: a scripted support lead who reviews support-desk traces and
comments, in words only, on the first turn that went against the refund policy
(`training.environments.support_operator`). Its comments go in through the product's own
comment service, so they follow the path a real operator's words take: the judge sees them
and feedback training sets read them. They are filed under the `simulated-operator`
account, which cannot log in and whose name says what it is."""

from __future__ import annotations

import logging
import random
from collections import Counter

from django.contrib.auth import get_user_model
from django.db import transaction

from feedback.models import Comment, MessageRole, Trace
from feedback.selectors.traces import message_as_openai
from feedback.services.review import comment_add
from training.environments import support_operator
from training.environments.support_desk import SupportDesk

logger = logging.getLogger(__name__)

SIMULATED_OPERATOR = "simulated-operator"


def simulated_operator_user():
    """The account the simulated lead's comments are filed under: inactive, with no usable
    password, on every call (an account of that name made by hand is made so too)."""
    user, _created = get_user_model().objects.get_or_create(
        username=SIMULATED_OPERATOR,
        defaults={"first_name": "Simulated", "last_name": "operator (scripted, knows the policy)"},
    )
    if user.is_active or user.has_usable_password():
        user.is_active = False
        user.set_unusable_password()
        user.save(update_fields=["is_active", "password"])
    return user


def simulated_operator_review(
    *,
    traces,
    seed: int = 0,
    vague_rate: float | None = None,
    wrong_rate: float | None = None,
) -> Counter:
    """Comment on each training-split support-desk trace of `traces` (a queryset) where a
    turn went against the policy. A trace the lead has commented on is left alone, and so is
    a held-out one: words from a script that knows the policy must not reach the traces a
    candidate is measured on. Returns the counts by kind ("specific", "vague", "wrong"),
    "held_out", and "skipped" for traces of no known task or that cannot be read."""
    env = SupportDesk()
    tasks = {t.id: t for t in env.tasks()}
    author = simulated_operator_user()
    rates = {
        "vague_rate": support_operator.VAGUE_RATE if vague_rate is None else vague_rate,
        "wrong_rate": support_operator.WRONG_RATE if wrong_rate is None else wrong_rate,
    }
    counts: Counter = Counter()
    reviewed = Comment.objects.filter(author=author).values("trace_id")
    for trace_id in (
        traces.filter(environment=env.name).exclude(pk__in=reviewed).order_by("pk").values_list("pk", flat=True)
    ):
        with transaction.atomic():
            # Locked, and checked again under the lock: two reviews at once comment once.
            trace = Trace.objects.select_for_update().get(pk=trace_id)
            if Comment.objects.filter(trace=trace, author=author).exists():
                continue
            meta = trace.metadata if isinstance(trace.metadata, dict) else {}
            task_id, split = meta.get("task_id"), meta.get("split")
            if split != "train" and isinstance(split, str) and split:
                # Validation, test and freshly generated slices alike.
                counts["held_out"] += 1
                continue
            task = tasks.get(task_id) if isinstance(task_id, str) else None
            if task is None or split != task.split:
                counts["skipped"] += 1
                continue
            rows = list(trace.messages.order_by("position"))
            # One stream per trace: the same traces get the same words whatever else is reviewed.
            rng = random.Random(f"{seed}:{trace.deployment_id}:{trace.external_id}")
            try:
                comment = support_operator.operator_comment(
                    task=task, messages=[message_as_openai(m) for m in rows], rng=rng, env=env, **rates
                )
            except (TypeError, ValueError, KeyError, AttributeError, OverflowError, RecursionError):
                # Logged content is untrusted; one unreadable trace must not stop the review,
                # but the reader sees which one was left and why.
                logger.warning("simulated review skipped trace %s: unreadable", trace.external_id, exc_info=True)
                counts["skipped"] += 1
                continue
            if comment is None or rows[comment.message_index].role != MessageRole.ASSISTANT:
                continue
            comment_add(message=rows[comment.message_index], author=author, body=comment.body)
            counts[comment.kind] += 1
    return counts
