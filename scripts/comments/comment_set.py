"""Operators' comments → a training set: the base's training-split episodes stored as traces,
the simulated lead's comments on them through the comment service, the set built from the
comments and the check that it carries words only; and the oracle reward, looked up beside
the items rather than in them."""

from __future__ import annotations

from typing import Any

from desk import log
from desk.harness import Harness

from comments.options import Options


class OracleLeak(RuntimeError):
    """A comments-only training set carries something only the hidden policy knows."""


def comments_set(*, harness: Harness, seed: int, options: Options) -> dict[str, Any]:
    """Steps 1 to 3 for one seed: the base's training episodes as traces, the simulated lead's
    comments on them through the comment service, and the set built from the comments.
    Returns the set, its deployment, the review's counts, the episodes' outcome, the
    episodes themselves (`played`) and the commented turns as (trace, message) pairs in the
    order the lead wrote the comments (`commented`)."""
    from feedback.demo.operator import simulated_operator_review, simulated_operator_user
    from feedback.models import Comment, Trace
    from training.environments.support_desk import tasks_sample
    from training.services.feedback_sets import training_set_from_feedback
    from training.serving.models import Deployment

    tasks = tasks_sample(split="train", count=options.train_episodes, seed=20_000 + seed, graded_share=1.0)
    log(f"seed {seed}: the base plays {len(tasks)} training-split episodes for the lead to review")
    played = harness.episodes(tasks, seed=seed * 1_000 + 500)
    deployment, _ = Deployment.objects.get_or_create(
        name=f"lfc-{options.run}-seed{seed}",
        defaults={"description": "learn-from-comments: the base's training-split episodes, for the simulated lead"},
    )
    episodes_store(deployment=deployment, played=played, seed=seed)
    counts = simulated_operator_review(
        traces=Trace.objects.filter(deployment=deployment),
        seed=seed,
        vague_rate=options.vague_rate,
        wrong_rate=options.wrong_rate,
    )
    bank, words = (
        bank_words(deployment=deployment, seed=seed, options=options) if options.comments == "bank" else (None, {})
    )
    training_set = training_set_from_feedback(
        name=f"lfc-{options.run}-seed{seed}",
        filters={"comment": "yes"},
        deployment=deployment,
        heldout_fraction=0.0,
        description="the simulated lead's comments on the base's failed training-split episodes",
    )
    words_only_check(training_set)
    written = Comment.objects.filter(
        trace__deployment=deployment, author=simulated_operator_user(), message__role="assistant"
    ).select_related("trace", "message")
    return {
        "training_set": training_set,
        "deployment": deployment,
        "review": dict(counts) | ({"bank": bank} if bank is not None else {}),
        # Whose words each commented turn holds (by message id), for the judge's figures by words.
        "words": words,
        "episodes": len(played),
        "successes": sum(e.reward >= 1.0 for e in played),
        "played": played,
        "commented": [(c.trace, c.message) for c in written.order_by("id")],
    }


def bank_words(*, deployment, seed: int, options: Options) -> tuple[dict[str, int], dict[int, str]]:
    """`--comments bank`: the lead's comment on each decision turn (a plain refund of the
    customer's order, or an answer, right after the lookup of that order) is rewritten,
    through the comment service, in a phrasing of the comment bank
    (`training.environments.comment_bank`, written apart from the simulated lead) about
    that order. The lead still decides which turns get a comment; whether it is specific,
    vague or wrong is drawn again at the lead's rates, and a specific comment asks for the
    policy's action, a wrong one for the other. Other comments keep the lead's words: on a
    turn that is no such decision (a missing lookup, another order, a wrong amount) the bank
    has no phrasing that says what went wrong, and now and then no bank phrasing of the drawn
    kind fits the order. So a final run's readers read words no template of the simulator
    wrote; only the readers' outputs (actions, a note's labels) reach the policy's targets.

    Returns the counts (rewritten by kind; kept because the turn is no decision; kept
    because nothing fitted) and each commented message's words by id: "bank-<kind>/<bank
    id>" or "lead"."""
    import random
    from collections import Counter

    from feedback.demo.operator import simulated_operator_user
    from feedback.models import Comment
    from feedback.services.review import comment_edit
    from training.environments.comment_bank import FITS, comment_bank
    from training.environments.support_desk import SupportDesk
    from training.environments.support_desk.store import order_kind
    from training.environments.support_operator import VAGUE_RATE, WRONG_RATE

    vague = VAGUE_RATE if options.vague_rate is None else options.vague_rate
    wrong = WRONG_RATE if options.wrong_rate is None else options.wrong_rate
    tasks = {t.id: t for t in SupportDesk().tasks()}
    author = simulated_operator_user()
    counts: Counter = Counter()
    words: dict[int, str] = {}
    written = Comment.objects.filter(trace__deployment=deployment, author=author).select_related("trace", "message")
    for comment in written.order_by("id"):
        words[comment.message_id] = "lead"
        row = _decision_row(comment, tasks)
        if row is None:
            counts["lead_no_decision"] += 1
            continue
        kind_of_order = order_kind(row)
        policy = "refund" if kind_of_order in FITS["refundable"] else "reply"
        # One stream per trace, apart from the lead's: the same turn gets the same words.
        rng = random.Random(f"bank:{seed}:{comment.trace.external_id}")
        draw = rng.random()
        kind = "wrong" if draw < wrong else "vague" if draw < wrong + vague else "specific"
        fitting = [
            c
            for c in comment_bank()
            if c.kind == kind
            and c.fits_kind(kind_of_order)
            and (c.asks is None or (c.asks == policy) == (kind == "specific"))
        ]
        if not fitting:
            counts["lead_nothing_fits"] += 1
            continue
        chosen = rng.choice(fitting)
        comment_edit(comment=comment, user=author, body=chosen.render(row))
        counts[f"bank_{kind}"] += 1
        words[comment.message_id] = f"bank-{kind}/{chosen.id}"
    return dict(counts), words


def _decision_row(comment, tasks: dict) -> dict[str, Any] | None:
    """The looked-up row of the customer's order when `comment` is on a decision turn right
    after that lookup (a reply, or a refund of that order with no amount of its own); else
    None. Logged content is untrusted: anything unexpected is no decision."""
    import json

    from training.environments.records import key_normalized

    meta = comment.trace.metadata if isinstance(comment.trace.metadata, dict) else {}
    task_id = meta.get("task_id")
    task = tasks.get(task_id) if isinstance(task_id, str) else None
    if task is None:
        return None
    order = key_normalized(task.hidden["order_id"])
    calls = comment.message.tool_calls or []
    for call in calls if isinstance(calls, list) else [None]:
        function = call.get("function") if isinstance(call, dict) else None
        try:
            arguments = json.loads(function.get("arguments") or "{}") if isinstance(function, dict) else None
        except (TypeError, ValueError):
            arguments = None
        if (
            not isinstance(arguments, dict)
            or function.get("name") != "issue_refund"
            or key_normalized(str(arguments.get("order_id", ""))) != order
            or "amount" in arguments
        ):
            return None
    before = comment.trace.messages.filter(position__lt=comment.message.position).order_by("-position").first()
    if before is None or before.role != "tool":
        return None
    try:
        row = json.loads(before.content)
    except (TypeError, ValueError):
        return None
    if (
        not isinstance(row, dict)
        or not isinstance(row.get("status"), str)
        or key_normalized(str(row.get("order_id", ""))) != order
        or not (row.get("delivered_days_ago") is None or type(row["delivered_days_ago"]) is int)
    ):
        return None
    return row


def episodes_store(*, deployment, played, seed: int) -> None:
    """The base's played training-split episodes as traces of `deployment` (a second call
    with the same episodes stores nothing new)."""
    from training.environments.support_desk import SupportDesk
    from training.services.episodes import episodes_record

    results = episodes_record(
        deployment=deployment,
        environment=SupportDesk.name,
        episodes=played,
        model_version="base",
        job_id=None,
        step=0,
        phase=f"train-seed{seed}",
    )
    failed = [r for r in results if r.status == "error"]
    if failed:
        raise RuntimeError(f"{len(failed)} episodes were not recorded on {deployment.name}: {failed[0].errors}")


def words_only_check(training_set) -> None:
    """Refuse a comments set that carries anything the hidden policy knows: every item must
    have a comment by the simulated lead and no corrected response, reference answer,
    grader or judgement (which, without a judge, could only come from `turn_target`)."""
    from feedback.demo.operator import SIMULATED_OPERATOR

    problems = []
    for row in training_set.items.all():
        found = [
            name
            for name, value in (
                ("corrected_response", row.corrected_response),
                ("reference", row.reference),
                ("grader", row.grader),
                ("rubric", row.rubric),
            )
            if value
        ]
        if not row.feedback.strip():
            found.append("no comment")
        if row.provenance.get("comment_authors") != [SIMULATED_OPERATOR]:
            found.append(f"comments by {row.provenance.get('comment_authors')}")
        if found:
            problems.append(f"{row.key}: {', '.join(found)}")
    if problems:
        raise OracleLeak(f"{len(problems)} items carry more than the lead's words: {problems[:3]}")


def item_tasks(training_set) -> dict[str, Any]:
    """Each item's support-desk task, read from its trace's metadata. Kept apart from the
    items: only the oracle reward reads it, never the training set."""
    from training.environments.support_desk import SupportDesk

    tasks = {t.id: t for t in SupportDesk().tasks()}
    rows = training_set.items.select_related("trace").only("key", "trace__metadata")
    return {row.key: tasks[row.trace.metadata["task_id"]] for row in rows}


def oracle_reward(task_of: dict[str, Any]):
    """The ORACLE scorer: the `tool_action` grade of each candidate turn against the
    actions the hidden policy accepts at that point (`turn_reference`)."""
    from training.environments.support_desk import turn_reference
    from training.trainer.graders import grade

    def score(item, candidates: list[str]) -> list[float]:
        reference = turn_reference(task=task_of[item.id], messages=item.messages) or ""
        return [grade("tool_action", c, reference) for c in candidates]

    return score
