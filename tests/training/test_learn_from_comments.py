"""`make learn-from-comments` on the tiny random model: the base's episodes → the simulated
lead's comments through the comment service → a words-only set → every arm trains → the
summary prints the paired figures over seeds. And the comments' judge path: a GRPO step
scored by the judge under the operator's comment."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "learn_from_comments", Path(__file__).parent.parent.parent / "scripts" / "learn_from_comments.py"
)
lfc = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = lfc  # its dataclasses look their module up
spec.loader.exec_module(lfc)

pytestmark = pytest.mark.django_db


def _options(tiny_model_dir, tmp_path, **overrides):
    sizes = {"model": tiny_model_dir, "seeds": [0, 1], "fresh_seeds": [3], "out": tmp_path, "run": "t", **lfc.QUICK}
    return lfc.Options(**(sizes | overrides))


def _hinted_grpo_available() -> bool:
    from training.trainer.config import GRPOConfig

    return {"hint_samples", "hint_template", "hint_cap"} <= set(GRPOConfig.__dataclass_fields__)


@pytest.mark.slow
def test_comments_become_a_words_only_set_and_each_arm_is_measured_against_the_base(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    import comments.runs

    from feedback.demo.operator import SIMULATED_OPERATOR
    from feedback.models import Comment
    from training.models import TrainingSet
    from training.promotion.evaluation.split_looks import split_look_record, split_looks

    looks = tmp_path / "looks.jsonl"
    checked = comments.runs.looks_check

    def another_process_looks_meanwhile(options):
        # A process started beside this one with the same arm and seed measures it first.
        checked(options)
        family = comments.runs.look_family("oracle-sft", options)
        split_look_record(family=family, script="another process", argv=[], seeds=[1], path=looks)

    monkeypatch.setattr(comments.runs, "looks_check", another_process_looks_meanwhile)
    lfc.run(_options(tiny_model_dir, tmp_path, looks_log=looks))

    # The lead's words went in through the comment service, under the account that says
    # it is scripted and cannot log in.
    comments = Comment.objects.select_related("author")
    assert comments.exists()
    assert {c.author.username for c in comments} == {SIMULATED_OPERATOR}
    assert not comments[0].author.is_active
    # Only training-split traces are commented on.
    assert {c.trace.metadata["split"] for c in comments} == {"train"}

    # Each seed's set: the comment as feedback, nothing that only the hidden policy knows.
    for seed in (0, 1):
        training_set = TrainingSet.objects.get(name=f"lfc-t-seed{seed}")
        items = list(training_set.items.all())
        assert items and all(it.feedback for it in items)
        assert not any(it.corrected_response or it.reference or it.grader or it.rubric for it in items)

    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    kinds = [(r["kind"], r.get("recipe"), r["seed"]) for r in records]
    for seed in (0, 1):
        assert ("comments", None, seed) in kinds
        assert ("candidate", "distill", seed) in kinds
        hinted = "candidate" if _hinted_grpo_available() else "skipped"
        assert (hinted, "hinted-grpo", seed) in kinds
    # Each arm's look at the test split is checked again and logged just before it is
    # measured: the one the other process took first is not measured twice.
    assert ("candidate", "oracle-sft", 0) in kinds and ("candidate", "oracle-sft", 1) not in kinds
    (refused,) = [r for r in records if r["kind"] == "skipped" and r["recipe"] == "oracle-sft"]
    assert refused["seed"] == 1 and refused["reason"].startswith("not measured: the test split was already measured")
    logged = [(x["family"], x["seeds"], x.get("run")) for x in split_looks(looks)]
    measured = [(r["recipe"], r["seed"]) for r in records if r["kind"] == "candidate"]
    assert len(logged) == 1 + len(measured)
    assert ("lfc-oracle-sft (decisions-weighted-32-cf3, 1 step)", [0], "t") in logged
    assert ("lfc-distill (lead comments, 1 step)", [1], "t") in logged
    trained = [r for r in records if r["kind"] == "candidate"]
    for r in trained:
        if r["recipe"] == "hinted-grpo":  # each step says whether the comments gave a gradient
            assert [s["step"] for s in r["train"]["hint_steps"]] == [1]
            assert {"zero_variance_groups", "hinted_groups", "hinted_groups_with_variance"} <= set(
                r["train"]["hint_steps"][0]
            )
    assert all(r["train"]["steps_run"] == 1 and r["train"]["step_kept"] == 1 for r in trained)
    # Each arm's adapter is kept, for its decision curve (desk_experiment.py curve --adapter).
    assert all((Path(r["train"]["adapter"]) / "adapter_config.json").is_file() for r in trained)
    # The arms play the base's test and fresh tasks, in the same order: they pair by episode.
    base = {(r["seed"], r["split"], r["fresh_seed"]): r["measure"] for r in records if r["kind"] == "base"}
    for r in trained:
        for key, split, fresh in (("test", "test", None), ("fresh-3", "fresh", 3)):
            tasks = [e["task"] for e in r["measures"][key]["episodes"]]
            assert tasks == [e["task"] for e in base[(r["seed"], split, fresh)]["episodes"]]
    skipped = [r for r in records if r["kind"] == "skipped"]
    # No judge was given: the judge arm says so instead of training on nothing.
    assert {("judge-sft", 0), ("judge-sft", 1)} <= {(r["recipe"], r["seed"]) for r in skipped}
    assert all("hint fields" in r["reason"] or "no judge" in r["reason"] for r in skipped if r is not refused)

    capsys.readouterr()
    lfc.summary(tmp_path / "runs.jsonl")
    out = capsys.readouterr().out
    # Two seeds: the mean with its interval, base and gain, and the gain paired by episode.
    row = next(line for line in out.splitlines() if line.startswith("| distill | test | 2 |"))
    assert row.count("[") >= 3 and "(n = 6)" in row
    assert "| distill | fresh-3 | 2 |" in out
    assert "judge-sft seed 0 skipped: no judge" in out
    if not _hinted_grpo_available():
        assert "hinted-grpo seed 0 skipped" in out


@pytest.mark.slow
def test_the_judge_arm_trains_on_the_corrections_the_judge_writes_from_the_comments(
    tiny_model_dir, tmp_path, judge_server
):
    """The judge path of learning from words: each commented turn is judged through the
    product's `judge_run` (prompt judge-turn/v2, the deployment's own endpoint), the set is
    rebuilt with the judge's corrections, and the policy is fine-tuned on them and measured
    against the base. The judge here is the wire-protocol test server; it answers every turn
    with a lookup of the id the comment names."""
    import re

    from feedback.models import JudgeResult
    from tests.fixtures.judge import user_prompt
    from training.models import CorrectionSource, TrainingSet

    def judge(request):
        feedback = user_prompt(request).split("<feedback>")[-1]
        named = re.findall(r"\b[A-Z0-9][A-Z0-9-]{2,14}\b", feedback)
        call = {"name": "lookup_order", "arguments": {"order_id": named[0] if named else "UNKNOWN"}}
        return {
            "rubric": {"criteria": [{"criterion": "Works on the order the customer names", "weight": 3}]},
            "rationale": "The comment says which order.",
            "reward": 0.0,
            "corrected_response": f"<tool_call>{json.dumps(call)}</tool_call>",
        }

    judge_server.respond_with(judge)
    options = _options(
        tiny_model_dir,
        tmp_path,
        seeds=[0],
        arms=("judge-sft",),
        fresh_seeds=[],
        judge_url=judge_server.base_url,
        judge_model="test-judge",
        judge_key="test-key",
        judge_concurrency=1,
    )

    lfc.run(options)

    judged = JudgeResult.objects.all()
    assert judged and {(r.status, r.prompt_version) for r in judged} == {("succeeded", "judge-turn/v2")}
    assert all("<feedback>" in user_prompt(r) for r in judge_server.requests)
    words = TrainingSet.objects.get(name="lfc-t-seed0")
    corrected = TrainingSet.objects.get(name="lfc-t-seed0-judge")
    assert corrected.item_count == words.item_count
    assert {it.correction_source for it in corrected.items.all()} == {CorrectionSource.JUDGE}
    assert corrected.selection["judge_gate"]["override"]["by"] == lfc.EXPERIMENTER
    (record,) = [json.loads(x) for x in (tmp_path / "runs.jsonl").read_text().splitlines() if '"candidate"' in x]
    assert record["recipe"] == "judge-sft" and record["train"]["steps_run"] == 1
    figures = record["train"]["judge"]
    assert figures["judged"] == figures["succeeded"] == figures["corrections"] == words.item_count
    assert 0.0 <= figures["corrections_right_by_oracle"] <= 1.0
    assert "test" in record["measures"]


def test_a_set_that_carries_an_oracle_answer_is_refused():
    from training.services.training_sets import training_set_create

    turn = {
        "key": "turn:1:x:3",
        "messages": [{"role": "user", "content": "Refund K4821 please."}],
        "feedback": "It arrived 7 days ago, refund it.",
        "provenance": {"comment_authors": ["simulated-operator"]},
    }
    clean = training_set_create(name="words", items=[turn], heldout_fraction=0.0)
    lfc.words_only_check(clean)
    leaked = training_set_create(
        name="leaked", items=[turn | {"corrected_response": "<tool_call>…</tool_call>"}], heldout_fraction=0.0
    )
    with pytest.raises(lfc.OracleLeak, match="corrected_response"):
        lfc.words_only_check(leaked)
    by_someone_else = training_set_create(
        name="other", items=[turn | {"provenance": {"comment_authors": ["olga"]}}], heldout_fraction=0.0
    )
    with pytest.raises(lfc.OracleLeak, match="comments by"):
        lfc.words_only_check(by_someone_else)


def test_the_judge_scores_fresh_samples_under_the_operators_comment(tiny_model_dir, tmp_path, judge_settings):
    """The comments' judge path, without an oracle: a set built from an operator's comment
    (no judgement yet), a GRPO step whose groups the judge scores with `score_candidates`
    under the comment as the rubric — the wire protocol of a real endpoint."""
    from feedback.models import CandidateScoring
    from feedback.services.review import comment_add
    from tests.factories import MessageFactory, TraceFactory, user_with_role
    from tests.fixtures.judge import presented_responses, user_prompt
    from training.services.feedback_sets import training_set_from_feedback
    from training.services.job_runner import training_set_items
    from training.services.job_scoring import scorer_for
    from training.trainer.config import GRPOConfig
    from training.trainer.grpo import grpo_train

    trace = TraceFactory()
    MessageFactory(trace=trace, position=0, content="Please refund order K4821, it came broken.")
    turn = MessageFactory(trace=trace, position=1, role="assistant", content="Sorry, we cannot refund that order.")
    words = "K4821 was delivered 7 days ago, inside our 30-day window: refund it in full."
    comment_add(message=turn, author=user_with_role("operator", "olga"), body=words)
    training_set = training_set_from_feedback(name="comment-judged", filters={"comment": "yes"}, heldout_fraction=0.0)
    items, _ = training_set_items(training_set)
    assert [it.rubric for it in items] == [words]  # no judgement: the comment is what the judge scores against

    def judge(request):
        shown = presented_responses(request)
        return {"scores": [{"response": i, "reason": "r", "score": 0.5 * (i % 2)} for i, _ in enumerate(shown, 1)]}

    judge_settings.respond_with(judge)
    config = GRPOConfig(
        model_path=str(tiny_model_dir),
        steps=1,
        prompts_per_step=1,
        group_size=2,
        max_new_tokens=6,
        eval_every=0,
        checkpoint_every=0,
        samples_every=0,
        log_kl=False,
    )
    result = grpo_train(
        config=config, items=items, score=scorer_for(items, deployment=trace.deployment), run_dir=tmp_path, export=False
    )
    assert result.step == 1
    assert words in user_prompt(judge_settings.requests[0])
    assert result.history[0]["reward_mean"] == pytest.approx(0.25)
    assert CandidateScoring.objects.filter(item_key=items[0].id, status="succeeded").count() == 1


def test_the_tours_distillation_settings_are_the_ones_the_comparison_measures():
    from training.trainer.config import DistillConfig
    from webapp.site.selectors_tour import comment_job_settings

    options = lfc.Options()
    measured = DistillConfig.from_dict(lfc._common(options, 0) | {"samples_per_prompt": options.distill_samples})
    for name, value in json.loads(comment_job_settings()).items():
        assert getattr(measured, name) == value, name


@pytest.mark.slow
def test_the_hint_probe_measures_each_commented_turn_with_and_without_the_comment(tiny_model_dir, tmp_path, capsys):
    options = _options(tiny_model_dir, tmp_path, seeds=[0], train_episodes=4)
    lfc.hint_probe(options, samples=2)

    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    probes = [r for r in records if r["kind"] == "probe"]
    comments = next(r for r in records if r["kind"] == "comments")
    assert len(probes) == comments["items"] > 0  # every commented turn, once
    for r in probes:
        assert r["comment"] and r["turn"] in ("first call", "refund", "reply or lookup")
        assert all(r[v] in (0.0, 0.5, 1.0) for v in ("none", "system", "last"))  # 2 samples each
    out = capsys.readouterr().out
    assert "ORACLE grade, measurement only" in out
    assert any(line.split()[:1] == [probes[0]["turn"].split()[0]] for line in out.splitlines())


NOTE_RULE = {
    "conditions": [
        {"field": "status", "op": "=", "value": "delivered"},
        {"field": "delivered_days_ago", "op": "<=", "value": 30},
    ],
    "action": "issue_refund",
    "otherwise": "reply",
}


def _words_judge(request):
    """The test judge of the words arms, answering by the schema the request asks for: a
    policy note with NOTE_RULE, or the first action the action schema allows (the first
    tool whose id arguments the conversation can fill, else a reply)."""
    asked = request["response_format"]["json_schema"]
    if asked["name"] == "policy_note":
        return {
            "text": "Refund delivered orders within 30 days.",
            "rule": NOTE_RULE,
            "supporting": [1],
            "contradicting": [],
        }
    assert asked["name"] == "action_judgement", asked["name"]
    for choice in asked["schema"]["properties"]["action"]["anyOf"]:
        props = choice["properties"]
        if props["kind"]["enum"] != ["tool"]:
            continue
        arguments = {k: v["enum"][-1] for k, v in props["arguments"]["properties"].items() if v.get("enum")}
        if set(props["arguments"].get("required", [])) <= set(arguments):
            action = {"kind": "tool", "name": props["name"]["enum"][0], "arguments": arguments}
            return {"rationale": "The comment asks for this.", "action": action, "reward": 0.0}
    action = {"kind": "reply", "text": "Sorry, this order cannot be refunded."}
    return {"rationale": "The comment asks for this.", "action": action, "reward": 0.0}


@pytest.mark.slow
def test_the_words_arm_and_its_shuffled_control_learn_from_the_judges_actions_and_note(
    tiny_model_dir, tmp_path, judge_server, monkeypatch
):
    """Issue 39's comparison, `--quick`: A1 oracle labels, and A2 and A3: the judge (choosing among the agent's actions) reads each
    commented turn, and proposes a policy note from the same comments; the policy learns from
    the chosen actions and the decision points the note labels. A3 does the same on a twin
    deployment where every comment sits on another commented turn."""
    import dataclasses
    from collections import Counter

    from comments.words import judge_set_items, note_labelled
    from desk.items import note_turn, oracle_items

    from feedback.judge.prompts import CURRENT_ACTION
    from feedback.models import Comment, JudgeResult, PolicyNote
    from training.environments.policy_rules import rule_parse
    from training.environments.support_desk import SupportDesk
    from training.models import CorrectionSource, TrainingSet

    judge_server.respond_with(_words_judge)
    monkeypatch.setenv("PRACTICUM_LFC_JUDGE_KEY", "test-key")
    # The comparison as a user starts it (A0 is the base every arm is measured against),
    # in the quick mode's sizes.
    lfc.main(
        [
            "run",
            "--quick",
            "--seeds",
            "1",
            "--no-fresh",
            "--model",
            str(tiny_model_dir),
            "--out",
            str(tmp_path),
            "--run",
            "t",
            "--arms",
            "oracle-sft",
            "words",
            "words-shuffled",
            "--judge-url",
            judge_server.base_url,
            "--judge-model",
            "test-judge",
            "--judge-concurrency",
            "1",
            "--looks-log",
            str(tmp_path / "looks.jsonl"),
        ]
    )

    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [(r["seed"], r["split"]) for r in records if r["kind"] == "base"] == [(0, "test")]
    # Each arm's measurement on the test split is a look, logged with the command line.
    looks = [json.loads(line) for line in (tmp_path / "looks.jsonl").read_text().splitlines()]
    assert [(x["family"], x["seeds"], x["look"], x["run"]) for x in looks] == [
        ("lfc-oracle-sft (decisions-weighted-32-cf3, 1 step)", [0], 1, "t"),
        ("lfc-words (lead comments, 1 step)", [0], 1, "t"),
        ("lfc-words-shuffled (lead comments, 1 step)", [0], 1, "t"),
    ]
    assert all(x["argv"][:2] == ["run", "--quick"] and "reason" not in x for x in looks)
    trained = {r["recipe"]: r for r in records if r["kind"] == "candidate"}
    assert set(trained) == {"oracle-sft", "words", "words-shuffled"}, [r for r in records if r["kind"] == "skipped"]
    assert "oracle labels" in trained.pop("oracle-sft")["train"]["signal"]
    for r in trained.values():
        train = r["train"]
        assert train["steps_run"] == 1 and "test" in r["measures"]
        assert train["note"]["rule"] == NOTE_RULE and train["note"]["read_comments"] >= 2
        assert "used unedited" in train["note"]["use"] and "no oracle label" in train["signal"]
        assert train["judge"]["correction_mode"] == "actions"
        assert train["judge"]["judged"] == train["judge"]["succeeded"] > 0
        assert 0.0 <= train["judge"]["corrections_right_by_oracle"] <= 1.0  # the judge measured, not trained on
        assert train["items"]["judge"] > 0 and train["items"]["note"] > 0
        assert train["train_items"] == train["items"]["judge"] + train["items"]["note"]

    # The judge chose among the agent's actions on both deployments' turns.
    judged = JudgeResult.objects.select_related("trace__deployment")
    assert {r.prompt_version for r in judged} == {CURRENT_ACTION.version}
    assert {r.trace.deployment.name for r in judged} == {"lfc-t-seed0", "lfc-t-seed0-shuffled"}
    # The reader's note is on each deployment's policy-note page, as an unapproved version 1.
    for name in ("lfc-t-seed0", "lfc-t-seed0-shuffled"):
        note = PolicyNote.objects.get(deployment__name=name)
        assert note.approved_version is None
        assert [(v.number, v.rule) for v in note.versions.all()] == [(1, NOTE_RULE)]

    # The twin: the same comments on the same turns, none on the turn it was written for.
    def turns(name):
        comments = Comment.objects.filter(trace__deployment__name=name).select_related("trace", "message")
        return {(c.trace.external_id, c.trace.metadata["task_id"], c.message.position): c.body for c in comments}

    original, shuffled = turns("lfc-t-seed0"), turns("lfc-t-seed0-shuffled")
    assert len(original) >= 2 and set(shuffled) == set(original)
    assert Counter(shuffled.values()) == Counter(original.values())
    assert all(shuffled[turn] != original[turn] for turn in original)
    assert trained["words-shuffled"]["train"]["shuffled"]["same_words"] == 0

    # Each set holds the judge's corrections and the note's labels only, and the check
    # refuses a set into which an oracle target is slipped.
    rule, text = rule_parse(NOTE_RULE), "Refund delivered orders within 30 days."
    note_items = note_labelled(rule=rule, text=text, seed=0)
    for arm, deployment in (("words", "lfc-t-seed0"), ("words-shuffled", "lfc-t-seed0-shuffled")):
        judge_set = TrainingSet.objects.get(name=f"lfc-t-seed0-{arm}-judge")
        assert {it.correction_source for it in judge_set.items.all()} == {CorrectionSource.JUDGE}
        ours = set(JudgeResult.objects.filter(trace__deployment__name=deployment).values_list("pk", flat=True))
        items = judge_set_items(judge_set, ours)
        assert len(items) == trained[arm]["train"]["items"]["judge"]
        lfc.words_set_check(
            judge_set=judge_set, ours=ours, judge_items=items, note_items=note_items, rule=rule, text=text
        )
    # The same canned note on both deployments: the control's note part is A2's, and says so.
    assert trained["words-shuffled"]["train"]["note"]["rule_same_as_words"] is True
    # A correction that is not this arm's own judgement (an earlier arm's, where this one's
    # failed) is refused.
    with pytest.raises(lfc.OracleLeak, match="is not one of this arm's"):
        lfc.words_set_check(
            judge_set=judge_set, ours=set(), judge_items=items, note_items=note_items, rule=rule, text=text
        )
    desk = SupportDesk()
    oracle = oracle_items(desk.tasks_for(split="train", graded=True)[:8], prefix="train")
    wrong_target = next(o for o in oracle if o.target != items[0].target)
    with pytest.raises(lfc.OracleLeak, match="not the judge's correction"):
        lfc.words_set_check(
            judge_set=judge_set,
            ours=ours,
            judge_items=[dataclasses.replace(items[0], target=wrong_target.target), *items[1:]],
            note_items=note_items,
            rule=rule,
            text=text,
        )
    decision = next(
        o
        for o in oracle
        if len(o.messages) == 4
        and (o.target, o.reference)
        != note_turn(json.loads(o.messages[-1]["content"])["order_id"], "refund" in o.reference, text)
    )
    with pytest.raises(lfc.OracleLeak, match="a target the note does not give"):
        lfc.words_set_check(
            judge_set=judge_set,
            ours=ours,
            judge_items=items,
            note_items=[*note_items, decision],
            rule=rule,
            text=text,
        )


def test_the_control_moves_every_comment_to_another_turn_with_other_words():
    """The shuffle's derangement: no comment stays on its turn, and where it can be helped
    no turn receives words equal to its own (vague comments repeat)."""
    import random

    from comments.words import derangement

    bodies = ["vague", "refund it", "vague", "look it up", "vague", "no refund"]
    for seed in range(20):
        sigma = derangement(bodies, random.Random(seed))
        assert sorted(sigma) == list(range(len(bodies)))
        assert all(sigma[i] != i and bodies[sigma[i]] != bodies[i] for i in range(len(bodies)))
    assert derangement(["same", "same"], random.Random(0)) == [1, 0]  # equal words: still moved


def test_a_second_look_at_an_arm_on_the_test_split_is_refused_before_anything_runs_unless_given_its_reason(
    tmp_path,
):
    from comments.runs import look_family

    from training.promotion.evaluation.split_looks import LOG, split_looks

    looks = tmp_path / "looks.jsonl"
    model = tmp_path / "no-model"  # a run that got past the check would fail to load it
    argv = ["run", "--model", str(model), "--seeds", "2", "--first-seed", "1", "--steps", "300"]
    argv += ["--comments", "bank", "--arms", "words", "--looks-log", str(looks)]
    words = "lfc-words (bank comments, 300 steps)"
    options = lfc.options_from(lfc.arguments(argv))
    assert look_family("words", options) == words
    lfc.looks_check(options)  # nothing logged yet: the run may measure
    looks.write_text(json.dumps({"family": words, "seeds": [5], "at": "2026-12-07T09:00:00Z"}) + "\n")
    lfc.looks_check(options)  # another seed of the family: the run's seeds 1 and 2 are unseen
    with looks.open("a") as f:
        f.write(json.dumps({"family": words, "seeds": [2], "at": "2026-12-07T10:00:00Z"}) + "\n")
    with pytest.raises(SystemExit, match=r"already measured for 'lfc-words \(bank comments, 300 steps\)'"):
        lfc.main(argv)
    lfc.looks_check(lfc.options_from(lfc.arguments([*argv, "--second-look", "a seed rerun after a stop"])))
    lfc.looks_check(lfc.options_from(lfc.arguments([*argv[:-3], "words-shuffled", *argv[-2:]])))  # another arm
    lfc.looks_check(lfc.options_from(lfc.arguments([*argv[:7], "--steps", "40", *argv[9:]])))  # another recipe
    with pytest.raises(SystemExit):
        lfc.arguments([*argv[:-2], "words"])  # the same arm twice in one run
    # A real run checks the project's log; a quick one, whose figures measure nothing, none.
    assert lfc.options_from(lfc.arguments(["run"])).looks_log == LOG
    assert lfc.options_from(lfc.arguments(["run", "--quick"])).looks_log is None
    assert lfc.options_from(lfc.arguments(["run", "--quick", "--looks-log", str(looks)])).looks_log == looks
    assert len(split_looks(looks)) == 2


def test_quick_gives_tiny_sizes_except_those_the_command_line_names():
    quick = lfc.options_from(lfc.arguments(["run", "--quick"]))
    assert (quick.train_episodes, quick.steps, quick.validate_at, quick.test_episodes) == (6, 1, [1], 3)
    named = lfc.options_from(lfc.arguments(["run", "--quick", "--train-episodes", "20", "--steps", "4"]))
    assert (named.train_episodes, named.steps, named.validate_at, named.test_episodes) == (20, 4, [2, 4], 3)
    full = lfc.options_from(lfc.arguments(["run"]))
    assert (full.train_episodes, full.steps) == (lfc.Options().train_episodes, lfc.Options().steps)


def test_an_oracle_recipe_named_keeps_its_own_steps_unless_they_are_given():
    from comments.arms import oracle_settings

    default = lfc.options_from(lfc.arguments(["run"]))
    assert (default.oracle_recipe, default.oracle_steps) == (lfc.Options().oracle_recipe, 75)
    named = lfc.options_from(lfc.arguments(["run", "--oracle-recipe", "bal6-s300"]))
    assert (named.oracle_recipe, named.oracle_steps) == ("bal6-s300", None)
    # What A1 then trains with: the recipe's 300 steps, its three checkpoints, its adapter.
    settings = oracle_settings(named)
    assert (settings["steps"], settings["validate_at"], settings["validate_episodes"]) == (300, [100, 200, 300], 16)
    assert (settings["trainable_layers"], settings["variant_cases"]) == (6, "balanced")
    wide = oracle_settings(lfc.options_from(lfc.arguments(["run", "--oracle-recipe", "bal6-all30"])))
    assert wide["trainable_layers"] == 30  # not the run's default of 6
    both = lfc.options_from(lfc.arguments(["run", "--oracle-recipe", "bal6-s300", "--oracle-steps", "40"]))
    assert (oracle_settings(both)["steps"], oracle_settings(both)["validate_at"]) == (40, [20, 40])
    quick = oracle_settings(lfc.options_from(lfc.arguments(["run", "--quick", "--oracle-recipe", "bal6-s300"])))
    assert (quick["steps"], quick["trainable_layers"], quick["lora_rank"]) == (1, 1, 4)  # the tiny model's
    for refused in ("no-such-recipe", "words-note"):  # a note's labels are no oracle labels
        with pytest.raises(SystemExit):
            lfc.arguments(["run", "--oracle-recipe", refused])


def test_bank_words_run_only_the_arms_that_never_train_on_the_words(capsys):
    with pytest.raises(SystemExit):
        lfc.arguments(["run", "--comments", "bank"])  # every arm, distillation on the words included
    assert "--comments bank runs only the arms" in capsys.readouterr().err
    args = lfc.arguments(["run", "--comments", "bank", "--arms", "oracle-sft", "words", "words-shuffled"])
    assert lfc.options_from(args).comments == "bank"


def _episode(external_id: str, task, reply: dict | None) -> dict:
    """A logged support-desk episode: the lookup of the customer's order and `reply` after
    it, or (reply None) an answer with no lookup at all."""
    from training.environments.support_desk import SupportDesk

    env = SupportDesk()
    order_id = task.hidden["order_id"]
    start = [{"role": "system", "content": task.system}, {"role": "user", "content": task.prompt}]
    if reply is None:
        messages = [*start, {"role": "assistant", "content": "Your order is fine."}]
    else:
        call = {
            "id": "c0",
            "type": "function",
            "function": {"name": "lookup_order", "arguments": json.dumps({"order_id": order_id})},
        }
        row = env.call(env.reset(task), "lookup_order", {"order_id": order_id})
        messages = [
            *start,
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c0", "content": row},
            reply,
        ]
    return {
        "external_id": external_id,
        "environment": "support-desk",
        "messages": messages,
        "metadata": {"environment": "support-desk", "task_id": task.id, "split": task.split},
    }


def _refund(order_id: str, **extra) -> dict:
    arguments = json.dumps({"order_id": order_id, **extra})
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "issue_refund", "arguments": arguments}}],
    }


def test_bank_comments_replace_the_leads_words_on_decision_turns_only():
    """`--comments bank`: the lead picks the turns; on a decision turn its words become a
    bank phrasing about the same order that asks for what the policy does (specific), and
    a turn the bank has no words for keeps the lead's comment."""
    from comments.comment_set import bank_words

    from feedback.demo.operator import simulated_operator_review
    from feedback.models import Comment, Trace
    from feedback.services.ingest import traces_ingest
    from tests.factories import DeploymentFactory
    from training.environments.comment_bank import comment_bank
    from training.environments.support_desk import SupportDesk

    deployment = DeploymentFactory(name="lfc-bank")
    tasks = SupportDesk().tasks_for(split="train", graded=True)
    due = [t for t in tasks if t.hidden["refund"]]
    late = next(t for t in tasks if t.hidden["kind"] == "late_near_line")
    odd = _episode("not-json", due[2], {"role": "assistant", "content": "Sorry, no refund for this order."})
    odd["messages"][3]["content"] = "<b>store down</b>"  # the lookup answered with no row
    results = traces_ingest(
        deployment=deployment,
        items=[
            _episode("refused", due[0], {"role": "assistant", "content": "Sorry, no refund for this order."}),
            _episode("refunded", late, _refund(late.hidden["order_id"])),
            _episode("no-lookup", due[1], None),
            # A refund of the right order for a made-up amount: what went wrong is the amount,
            # which no bank phrasing says.
            _episode("amount", due[3], _refund(due[3].hidden["order_id"], amount=0.01)),
            odd,
        ],
    )
    assert all(r.status != "error" for r in results), results
    simulated_operator_review(traces=Trace.objects.filter(deployment=deployment), seed=0, vague_rate=0, wrong_rate=0)
    lead = {c.trace.external_id: c.body for c in Comment.objects.select_related("trace")}
    assert {"refused", "refunded", "no-lookup", "amount"} <= set(lead)

    counts, words = bank_words(
        deployment=deployment, seed=0, options=lfc.Options(comments="bank", vague_rate=0.0, wrong_rate=0.0)
    )

    assert counts == {"bank_specific": 2, "lead_no_decision": len(lead) - 2}
    now = {c.trace.external_id: c for c in Comment.objects.select_related("trace", "message")}
    for kept in set(lead) - {"refused", "refunded"}:
        assert now[kept].body == lead[kept] and now[kept].edited_at is None
        assert words[now[kept].message_id] == "lead"
    desk = SupportDesk()
    for name, task, asks in (("refused", due[0], "refund"), ("refunded", late, "reply")):
        row = json.loads(desk.call(desk.reset(task), "lookup_order", {"order_id": task.hidden["order_id"]}))
        phrasings = {c.render(row): c for c in comment_bank() if c.kind == "specific"}
        assert now[name].body != lead[name] and now[name].edited_at is not None
        assert now[name].body in phrasings, now[name].body
        assert phrasings[now[name].body].asks == asks
        assert words[now[name].message_id] == f"bank-specific/{phrasings[now[name].body].id}"


def test_bank_comments_are_vague_and_wrong_at_the_rates_asked():
    """Every decision turn drawn wrong asks for the opposite of the policy; drawn vague,
    asks for nothing."""
    from comments.comment_set import bank_words

    from feedback.demo.operator import simulated_operator_review
    from feedback.models import Comment, Trace
    from feedback.services.ingest import traces_ingest
    from tests.factories import DeploymentFactory
    from training.environments.comment_bank import comment_bank
    from training.environments.support_desk import SupportDesk

    by_id = {c.id: c for c in comment_bank()}
    tasks = [t for t in SupportDesk().tasks_for(split="train", graded=True) if t.hidden["refund"]][:6]
    for rate, kind, asks in (("wrong_rate", "wrong", "reply"), ("vague_rate", "vague", None)):
        deployment = DeploymentFactory(name=f"lfc-bank-{kind}")
        items = [
            _episode(f"{kind}-{i}", t, {"role": "assistant", "content": "No refund."}) for i, t in enumerate(tasks)
        ]
        assert all(r.status != "error" for r in traces_ingest(deployment=deployment, items=items))
        simulated_operator_review(
            traces=Trace.objects.filter(deployment=deployment), seed=0, vague_rate=0, wrong_rate=0
        )
        options = lfc.Options(comments="bank", **({"vague_rate": 0.0, "wrong_rate": 0.0} | {rate: 1.0}))
        counts, words = bank_words(deployment=deployment, seed=0, options=options)
        assert counts == {f"bank_{kind}": len(tasks)}
        chosen = [by_id[w.split("/")[1]] for w in words.values()]
        assert all(c.kind == kind and c.asks == asks for c in chosen)
        assert Comment.objects.filter(trace__deployment=deployment, edited_at__isnull=False).count() == len(tasks)


def _base(seed, transcript):
    episodes = [{"task": "t1", "success": True, "transcript": transcript}]
    return {"kind": "base", "seed": seed, "split": "test", "fresh_seed": None, "measure": {"episodes": episodes}}


def _comments(seed, review):
    return {
        "kind": "comments",
        "seed": seed,
        "episodes": 4,
        "successes": 2,
        "review": review,
        "items": 2,
        "training_set": "s",
    }


def test_what_two_processes_of_a_seed_each_did_is_checked_for_the_same_outcome():
    same = lfc.processes_agreement([_base(0, ["lookup", "refund"]), _base(0, ["lookup", "refund"])])
    assert "  seed 0, base test: 2 times, the same each time" in same
    differ = lfc.processes_agreement([_base(0, ["lookup", "refund"]), _base(0, ["lookup", "reply"])])
    assert "  seed 0, base test: 2 times, DIFFERENT (the last is used)" in differ
    # The lead's comments, which the arms train on, are checked too.
    comments = lfc.processes_agreement([_comments(1, {"specific": 2}), _comments(1, {"specific": 1, "vague": 1})])
    assert "  seed 1, the lead's episodes and comments: 2 times, DIFFERENT (the last is used)" in comments
    # Done once: nothing to compare, nothing printed.
    assert lfc.processes_agreement([_base(0, ["lookup"]), _base(1, ["lookup"]), _comments(0, {})]) == []


def test_the_summary_reads_a_log_that_a_process_is_appending_to(tmp_path, capsys):
    record = json.dumps({"run": "r", "at": "-", **_comments(0, {"specific": 2})})
    (tmp_path / "runs.jsonl").write_text(record + "\n" + record[:40])  # the second still being written
    lfc.summary(tmp_path / "runs.jsonl")
    assert "seed 0: 2/4 episodes succeeded" in capsys.readouterr().out


def test_a_process_pairs_its_arms_with_the_base_another_process_of_the_run_measured(tmp_path, monkeypatch):
    import comments.runs

    played = []

    def measures(harness, *, seed, options, label, skip=frozenset()):
        keys = [
            k for k in ("test", "fresh-3", "fresh-4") if k in {"test", *(f"fresh-{f}" for f in options.fresh_seeds)}
        ]
        played.append((seed, [k for k in keys if k not in skip]))
        return {k: {"episodes": []} for k in keys if k not in skip}

    monkeypatch.setattr(comments.runs, "measures", measures)
    options = lfc.Options(out=tmp_path, run="r", fresh_seeds=[3])
    setup = comments.runs.base_setup(options)

    def base(seed, fresh=None, **extra):
        split = {"split": "fresh", "fresh_seed": fresh} if fresh else {}
        return json.dumps({"run": "r", **_base(seed, ["lookup"]), **split, "setup": setup, **extra}) + "\n"

    (tmp_path / "runs.jsonl").write_text(
        base(0)
        + base(0, 3)
        + '{"run": "r", "kind": "ba'  # a process killed as it wrote: passed over
        + "\n"
        + base(1, run="another run")
        + base(1, 3, run="another run")
        + base(2, setup={**setup, "test_episodes": 16})  # another setup
        + base(2, 3, setup={**setup, "test_episodes": 16})
        + base(3)
        + json.dumps({"run": "r", **_base(3, ["lookup"]), "split": "fresh", "fresh_seed": 3})  # no setup said
        + "\n"
    )

    # Seed 0's slices are in the run's log with this setup: not played again, nothing to append.
    assert comments.runs.base_measures(None, seed=0, options=options) == {}
    # Another run's, another setup's: played.
    assert set(comments.runs.base_measures(None, seed=1, options=options)) == {"test", "fresh-3"}
    assert set(comments.runs.base_measures(None, seed=2, options=options)) == {"test", "fresh-3"}
    # Only what is missing is played: seed 3's fresh slice, whose record says no setup.
    assert set(comments.runs.base_measures(None, seed=3, options=options)) == {"fresh-3"}
    # A slice asked for that no one measured, or the command line asking: played.
    comments.runs.base_measures(None, seed=0, options=lfc.Options(out=tmp_path, run="r", fresh_seeds=[3, 4]))
    comments.runs.base_measures(
        None, seed=0, options=lfc.Options(out=tmp_path, run="r", fresh_seeds=[3], base_again=True)
    )
    assert played == [
        (0, []),
        (1, ["test", "fresh-3"]),
        (2, ["test", "fresh-3"]),
        (3, ["fresh-3"]),
        (0, ["fresh-4"]),
        (0, ["test", "fresh-3"]),
    ]


def _arm(recipe, seed, successes, violations=()):
    episodes = [
        {
            "task": f"t{i}",
            "kind": "k" if i % 2 else "j",
            "success": ok,
            "violations": ["refund"] if i in violations else [],
        }
        for i, ok in enumerate(successes)
    ]
    if recipe == "base":
        return {"kind": "base", "seed": seed, "split": "test", "fresh_seed": None, "measure": {"episodes": episodes}}
    return {
        "kind": "candidate",
        "recipe": recipe,
        "seed": seed,
        "train": {},
        "measures": {"test": {"episodes": episodes}},
    }


@pytest.mark.slow
def test_a_second_process_of_a_run_plays_the_lead_again_and_pairs_with_the_logged_base(tiny_model_dir, tmp_path):
    first = _options(tiny_model_dir, tmp_path, seeds=[0], arms=("distill",))
    lfc.run(first)
    lfc.run(_options(tiny_model_dir, tmp_path, seeds=[0], arms=("oracle-sft",)))
    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    kinds = [(r["kind"], r.get("recipe"), r.get("split")) for r in records]
    # Each process plays the lead's episodes; the base's two slices are played once.
    assert kinds.count(("comments", None, None)) == 2
    assert [k for k in kinds if k[0] == "base"] == [("base", None, "test"), ("base", None, "fresh")]
    assert records[1]["setup"]["model"] == str(tiny_model_dir)
    (distill,) = [r for r in records if r.get("recipe") == "distill"]
    (oracle,) = [r for r in records if r.get("recipe") == "oracle-sft"]
    for key in ("test", "fresh-3"):
        assert [e["task"] for e in oracle["measures"][key]["episodes"]] == [
            e["task"] for e in distill["measures"][key]["episodes"]
        ]


def test_the_summary_reads_the_registered_endpoints_and_decides_nothing_before_every_seed_is_in():
    base = [False] * 4 + [True] * 4
    records = []
    for seed in (0, 1):
        records += [
            _arm("base", seed, base),
            _arm("words", seed, [True] * 8, violations=(0,)),
            _arm("words-shuffled", seed, [True, False] + [True] * 6),
        ]
    records.append(_arm("oracle-sft", 0, [True, True, True, False] + [True] * 4))

    early = lfc.endpoints(records, seeds_registered=5)
    assert "oracle-sft seeds [0]" in early[0] and "nothing is decided before they are in" in early[0]
    one, two, three, share = early[1:]
    # A2 right on the four tasks the base failed, on both seeds; A3 on three of them.
    assert one.startswith("  1. A2 - A0 = +0.500 [+") and one.endswith("on course")
    assert two.startswith("  2. A2 - A3 = +0.125") and two.endswith("on course")
    # One violation a seed where the base had none.
    assert three == "  3. policy violations, A0 0/16 against A2 2/16: needs A2's no higher: not met so far"
    # On seed 0, the only one A1 has: A1 +0.375, A2 +0.5.
    assert share == "  A1's gain that A2 recovers, seeds [0]: (+0.500) / (+0.375) = 133%"

    # Once every arm has the seeds registered, each endpoint holds or fails.
    decided = lfc.endpoints(records, seeds_registered=1)
    assert "nothing is decided" not in decided[0]
    assert [line.rsplit(": ", 1)[1] for line in decided[1:4]] == ["holds", "holds", "fails"]


def test_the_endpoints_leave_out_a_seed_whose_two_measurements_did_not_play_the_same_tasks():
    records = [_arm("base", 0, [False, True]), _arm("words", 0, [True, True])]
    other = _arm("words", 1, [True, True])
    other["measures"]["test"]["episodes"].reverse()  # t1, t0: not the base's order
    records += [_arm("base", 1, [False, True]), other, _arm("oracle-sft", 0, [False, False])]
    lines = lfc.endpoints(records)
    assert lines[1].startswith("  1. A2 - A0 = +0.500") and "x 1 seed)" in lines[1]
    assert "  3. policy violations, A0 0/2 against A2 0/2: needs A2's no higher: on course" in lines
    assert "  seed 1 left out of A2 - A0: the two did not play the same tasks" in lines
    # A1 lost on its one seed: no share of it is recovered.
    assert "  A1's gain that A2 recovers, seeds [0]: (+0.500) / (-0.500) = - (A1's gain is not above 0)" in lines
