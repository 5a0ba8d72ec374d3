"""The simulated operator: a scripted support lead who reviews support-desk traces and
comments, in words only, on the first turn that went against the refund policy
(`training.environments.support_operator`). Its comments go in through the product's own
comment service, so they follow the path a real operator's words take: the judge sees them
and feedback training sets read them. They are filed under the `simulated-operator`
account, which cannot log in and whose name says what it is."""

from __future__ import annotations

import random
from collections import Counter

from django.contrib.auth import get_user_model

from feedback.models import Comment, MessageRole
from feedback.selectors.traces import message_as_openai
from feedback.services.review import comment_add

SIMULATED_OPERATOR = "simulated-operator"


def simulated_operator_user():
    """The account the simulated lead's comments are filed under (created inactive, with no
    usable password: nobody logs in as it)."""
    user, created = get_user_model().objects.get_or_create(
        username=SIMULATED_OPERATOR,
        defaults={"first_name": "Simulated", "last_name": "operator (scripted, knows the policy)", "is_active": False},
    )
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def simulated_operator_review(
    *,
    traces,
    seed: int = 0,
    vague_rate: float | None = None,
    wrong_rate: float | None = None,
) -> Counter:
    """Comment on each support-desk trace of `traces` (a queryset) where a turn went against
    the policy; a trace the lead has already commented on is left alone. Returns the counts
    by kind ("specific", "vague", "wrong"), plus "skipped" for traces of no known task."""
    from training.environments import support_operator
    from training.environments.support_desk import SupportDesk

    env = SupportDesk()
    tasks = {(t.id, t.split): t for t in env.tasks()}
    author = simulated_operator_user()
    rates = {
        "vague_rate": support_operator.VAGUE_RATE if vague_rate is None else vague_rate,
        "wrong_rate": support_operator.WRONG_RATE if wrong_rate is None else wrong_rate,
    }
    counts: Counter = Counter()
    reviewed = Comment.objects.filter(author=author).values("trace_id")
    for trace in traces.filter(environment=env.name).exclude(pk__in=reviewed).order_by("pk"):
        task = tasks.get((trace.metadata.get("task_id"), trace.metadata.get("split")))
        if task is None:
            counts["skipped"] += 1
            continue
        rows = list(trace.messages.order_by("position"))
        # One stream per trace: the same traces get the same words whatever else is reviewed.
        rng = random.Random(f"{seed}:{trace.deployment_id}:{trace.external_id}")
        comment = support_operator.operator_comment(
            task=task, messages=[message_as_openai(m) for m in rows], rng=rng, env=env, **rates
        )
        if comment is None or rows[comment.message_index].role != MessageRole.ASSISTANT:
            continue
        comment_add(message=rows[comment.message_index], author=author, body=comment.body)
        counts[comment.kind] += 1
    return counts
