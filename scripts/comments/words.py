"""Issue 39's words-only arm (A2, `words`) and its control (A3, `words-shuffled`).

A2 learns from the simulated lead's comments alone, through two of the product's features:
the judge's chosen actions on the commented turns (`DeploymentJudge.correction_mode =
"actions"`: the judge picks each corrected turn among the agent's own actions), and a policy
note the judge proposes from the same comments (`policy_note_propose`), whose rule labels
the training split's decision points (`desk.items.note_items`). Nobody corrects either: the
note is used as the reader wrote it, where the product has a person approve a note before
it labels anything. No oracle label enters the set, and `words_set_check` refuses one that
holds any.

A3 runs the same pipeline on a twin of the seed's deployment: the same episodes, the same
commented turns, each comment moved to another commented turn by a seeded derangement. What
A2 gains over A3 is what the words say about their own turns, not their mere presence. Where
the comments state the rule themselves, the reader may write A3 the same note as A2 (the
record's `rule_same_as_words`), and then only the judge's part is controlled.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from desk import log
from desk.recipes import RECIPES

from comments.arms import sft_arm
from comments.comment_set import OracleLeak, episodes_store, words_only_check
from comments.judge import JudgeServer, judge_corrections, judge_patience
from comments.options import EXPERIMENTER, NO_JUDGE, Options

RECIPE = "bal6"  # the learning rate, first-token weight and copies of the dealt split's best oracle recipe
SIGNAL = (
    "words only: the judge's chosen actions on the commented turns, and decision points labelled by "
    "the note the judge wrote from the same comments; no oracle label"
)
NOTE_USE = "the reader's note, used unedited; in the product a person approves a note before it labels anything"


def words_train(arm: str, *, comments: dict[str, Any], seed: int, options: Options, run_dir: Path, judge: JudgeServer):
    """Train `arm` ("words" or "words-shuffled") for one seed: (policy, record), or (None,
    reason) when it cannot run (no judge, too few comments to shuffle, neither part gave
    an item)."""
    if not judge.configured:
        return None, NO_JUDGE
    if judge.failed:
        return None, f"the judge did not start: {judge.failed}"
    record: dict[str, Any] = {}
    source = comments
    if arm == "words-shuffled":
        if "shuffled" not in comments:  # once per seed
            comments["shuffled"] = shuffled_twin(comments=comments, seed=seed, options=options)
        source = comments["shuffled"]
        if source.get("skipped"):
            return None, source["skipped"]
        record["shuffled"] = {k: str(source[k]) for k in ("deployment", "training_set")} | {
            k: source[k] for k in ("moved", "same_words")
        }
    judge_set, figures, ours = judge_corrections(
        comments=source,
        seed=seed,
        options=options,
        judge=judge,
        mode="actions",
        name=f"lfc-{options.run}-seed{seed}-{arm}-judge",
    )
    judge_items = judge_set_items(judge_set, ours)
    rule, text, note = words_note(deployment=source["deployment"])
    # A3's note part equals A2's where the reader takes the rule from the words alone (they
    # state it, whichever turn they sit on): then only the judge part is controlled.
    if arm == "words":
        comments["words_rule"] = note.get("rule")
    elif "words_rule" in comments:
        note["rule_same_as_words"] = note.get("rule") == comments["words_rule"]
    items = note_labelled(rule=rule, text=text, seed=seed) if rule is not None else []
    if not judge_items and not items:
        return None, f"neither part gave an item: the judge wrote no correction ({figures}); note: {note}"
    words_set_check(judge_set=judge_set, ours=ours, judge_items=judge_items, note_items=items, rule=rule, text=text)
    log(f"{arm} seed {seed}: {len(judge_items)} judge items, {len(items)} note items")
    policy, trained = sft_arm(
        judge_items + items, recipe=RECIPE, seed=seed, options=options, run_dir=run_dir, label=arm
    )
    return policy, {
        "signal": SIGNAL + (" (each comment moved to another commented turn)" if arm == "words-shuffled" else ""),
        "judge": figures,
        "judge_set": str(judge_set),
        "note": note,
        "items": {"judge": len(judge_items), "note": len(items)},
        "settings_of": f"desk recipe {RECIPE}: its learning rate, first-token weight and "
        f"{RECIPES[RECIPE]['variants']} copies of each decision point",
        **record,
        **trained,
    }


def judge_set_items(judge_set, ours: set[int]) -> list:
    """The judge set's items that carry, as their target, the action a judgement of this
    call (`ours`) chose: a turn whose judgement failed here is left out, not given an
    earlier arm's correction."""
    from training.services.job_runner import training_set_items

    judged_here = {row.key for row in judge_set.items.all() if row.provenance.get("judge_result") in ours}
    items, _ = training_set_items(judge_set)
    return [it for it in items if it.target and it.id in judged_here]


def words_note(*, deployment) -> tuple[Any, str, dict[str, Any]]:
    """The policy note the deployment's judge proposes from its comments (the latest
    `MAX_COMMENTS`), stored as an unapproved version 1: (rule, text, record), the rule None
    (and the record saying why) when there is no note or it has no rule."""
    from django.contrib.auth import get_user_model

    from feedback.models import Comment, MessageRole
    from training.environments.policy_rules import rule_parse
    from training.policy_notes.services import MAX_COMMENTS, MIN_COMMENTS, PolicyNoteError, policy_note_propose

    count = Comment.objects.filter(trace__deployment=deployment, message__role=MessageRole.ASSISTANT).count()
    if count < MIN_COMMENTS:
        return None, "", {"none": f"{count} comments: a note is drawn from at least {MIN_COMMENTS}"}
    experimenter, _ = get_user_model().objects.get_or_create(username=EXPERIMENTER, defaults={"is_active": False})
    try:
        with judge_patience():
            note = policy_note_propose(deployment=deployment, requested_by=experimenter, limit=min(MAX_COMMENTS, count))
    except PolicyNoteError as exc:
        return None, "", {"none": f"the reader gave no note: {exc.reason}"}
    version = note.versions.get(number=1)
    record = {
        "id": note.pk,
        "version": version.number,
        "approved": note.approved_version_id is not None,
        "text": version.text,
        "rule": version.rule,
        "read_comments": version.read_comments,
        "prompt_version": version.prompt_version,
        "use": NOTE_USE,
    }
    if version.rule is None:
        return None, version.text, record | {"none": "the reader's note states no rule: it labels nothing"}
    rule = rule_parse(version.rule)
    return rule, version.text, record | {"rule_text": rule.text()}


def note_labelled(*, rule, text: str, seed: int) -> list:
    """The training split's graded decision points and 6 copies of each, labelled by the
    note's rule alone (as `desk_experiment`'s note recipes build them)."""
    from desk.items import note_items

    from training.environments.support_desk import SupportDesk

    tasks = SupportDesk().tasks_for(split="train", graded=True)
    return note_items(
        tasks, rule=rule, text=text, variants=RECIPES[RECIPE]["variants"], rng=random.Random(f"variants-{seed}")
    )


def words_set_check(*, judge_set, ours: set[int], judge_items: list, note_items: list, rule, text: str) -> None:
    """Refuse (`OracleLeak`) a words set that holds anything but the judge's corrections and
    the note's labels: every judge item's target must be the correction of the judgement its
    row names (correction source "judge", the lead's comment beside it, no reference or
    grader), and every note item the note's own label of its context."""
    from desk.items import words_only_check as note_only_check

    from feedback.demo.operator import SIMULATED_OPERATOR
    from feedback.models import JudgeResult, JudgeStatus
    from training.models import CorrectionSource

    rows = {row.key: row for row in judge_set.items.all()}
    judged = JudgeResult.objects.in_bulk([r.provenance.get("judge_result") for r in rows.values()])
    problems = []
    for item in judge_items:
        row = rows.get(item.id)
        if row is None:
            problems.append(f"{item.id}: not an item of {judge_set}")
            continue
        result = judged.get(row.provenance.get("judge_result"))
        found = []
        if row.correction_source != CorrectionSource.JUDGE:
            found.append(f"correction source {row.correction_source}")
        if result is None or result.status != JudgeStatus.SUCCEEDED:
            found.append("no judgement behind it")
        elif result.pk not in ours:
            found.append(f"judgement {result.pk} is not one of this arm's")
        elif not item.target or item.target != row.corrected_response or item.target != result.corrected_response:
            found.append("a target that is not the judge's correction")
        if row.reference or row.grader or item.reference or item.grader:
            found.append("a reference or grader")
        if row.provenance.get("comment_authors") != [SIMULATED_OPERATOR]:
            found.append(f"comments by {row.provenance.get('comment_authors')}")
        if found:
            problems.append(f"{item.id}: {', '.join(found)}")
    if problems:
        raise OracleLeak(f"{len(problems)} judge items carry more than the judge's words: {problems[:3]}")
    if note_items and rule is None:
        raise OracleLeak(f"{len(note_items)} note items without a note's rule")
    try:
        note_only_check(note_items, rule=rule, text=text)
    except SystemExit as exc:
        raise OracleLeak(str(exc)) from None


def derangement(bodies: list[str], rng: random.Random) -> list[int]:
    """A permutation `sigma` of the comments' indexes with sigma[i] ≠ i for all i (n ≥ 2):
    comment i goes to turn sigma[i]. Drawn uniformly among those that leave no turn with
    words equal to its own where one does (vague comments repeat), else the one of 1 000
    draws that leaves the fewest."""
    n = len(bodies)
    best: tuple[int, list[int]] | None = None
    for _ in range(1_000):
        sigma = rng.sample(range(n), n)
        if any(sigma[i] == i for i in range(n)):
            continue
        same = sum(bodies[i] == bodies[sigma[i]] for i in range(n))
        if same == 0:
            return sigma
        if best is None or same < best[0]:
            best = (same, sigma)
    if best is None:  # not reached for n ≥ 2 (a derangement is about 1 draw in e)
        raise RuntimeError(f"no derangement of {n} comments in 1 000 draws")
    return best[1]


def shuffled_twin(*, comments: dict[str, Any], seed: int, options: Options) -> dict[str, Any]:
    """A3's comments: a twin deployment `lfc-{run}-seed{seed}-shuffled` holding the same
    episodes, comment i's body added (through `comment_add`, as the simulated lead) to the
    twin's copy of commented turn sigma[i] (`derangement`, seeded); and the twin's words set.
    With fewer than 2 comments: {"skipped": why}."""
    from feedback.demo.operator import simulated_operator_user
    from feedback.models import Comment, Message
    from feedback.services.review import comment_add
    from training.services.feedback_sets import training_set_from_feedback
    from training.serving.models import Deployment

    commented = comments["commented"]
    if len(commented) < 2:
        return {"skipped": f"{len(commented)} commented turns: moving each comment to another needs at least 2"}
    body_of = {c.message_id: c.body for c in Comment.objects.filter(message__in=[m for _, m in commented])}
    bodies = [body_of[m.pk] for _, m in commented]
    twin, _ = Deployment.objects.get_or_create(
        name=f"lfc-{options.run}-seed{seed}-shuffled",
        defaults={"description": "learn-from-comments: the base's episodes again, each comment on another turn"},
    )
    author = simulated_operator_user()
    if Comment.objects.filter(trace__deployment=twin, author=author).exists():
        # Adding them again would put two comments on each turn (the original's review
        # skips the traces it has commented on; comment_add does not).
        return {"skipped": f"{twin.name} already holds the comments of an earlier run with this id: use a new --run"}
    episodes_store(deployment=twin, played=comments["played"], seed=seed)
    # The same turn of the same episode: its trace's external id (task and episode index)
    # and the message's position.
    turns = {
        (m.trace.external_id, m.position): m
        for m in Message.objects.filter(trace__deployment=twin, role="assistant").select_related("trace")
    }
    sigma = derangement(bodies, random.Random(f"shuffle-{seed}"))
    moved = []
    for i, body in enumerate(bodies):
        trace, message = commented[sigma[i]]
        comment_add(message=turns[(trace.external_id, message.position)], author=author, body=body)
        moved.append(
            {
                "from": [commented[i][0].metadata.get("task_id"), commented[i][1].position],
                "to": [trace.metadata.get("task_id"), message.position],
            }
        )
    training_set = training_set_from_feedback(
        name=f"lfc-{options.run}-seed{seed}-shuffled",
        filters={"comment": "yes"},
        deployment=twin,
        heldout_fraction=0.0,
        description="the simulated lead's comments on the base's failed training-split episodes, "
        "each moved to another commented turn",
    )
    words_only_check(training_set)
    same = sum(bodies[i] == bodies[sigma[i]] for i in range(len(bodies)))
    log(f"seed {seed}: {len(bodies)} comments moved to other turns on {twin.name} ({same} onto equal words)")
    return {
        "training_set": training_set,
        "deployment": twin,
        "moved": moved,
        "same_words": same,
    }
