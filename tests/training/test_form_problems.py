"""Forms that keep people on their errors, and sets that can be evaluated.

A set built with a held-out share always holds an item out (or says it cannot be evaluated
wherever sets are listed); a form that comes back keeps every value, names each error by its
field's label in a summary linked to the field, and gives a JSON error's line and column;
the job form starts from the live version, says how many items its method can use, and a
finished job links to the evaluation form filled in for its candidate."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.urls import reverse

from tests.factories import user_with_role
from tests.promotion.conftest import registry  # noqa: F401 - a live version and a newer candidate
from tests.promotion.test_regression_gate import glowing_evaluation, regressing_job
from training.models import TrainingJob, TrainingSplit
from training.promotion.models import Evaluation, PromotionRequest
from training.services.training_sets import split_for, training_set_create
from webapp.kernel.form_problems import json_object_error, problems
from webapp.kernel.work import WorkStatus

pytestmark = pytest.mark.django_db


def keys_on_the_train_side(count: int, fraction: float = 0.2) -> list[str]:
    """Keys the hash alone would all put on the train side at `fraction`."""
    keys = (f"turn-{i}" for i in range(1000))
    return [k for k in keys if split_for(k, fraction) == TrainingSplit.TRAIN][:count]


def turn_items(keys: list[str], *, corrected: int = 0) -> list[dict]:
    return [
        {
            "key": key,
            "messages": [{"role": "user", "content": f"question {i}"}],
            "feedback": "Look the order up first.",
            "corrected_response": "Let me look that up." if i < corrected else "",
        }
        for i, key in enumerate(keys)
    ]


@pytest.fixture
def operator_client(client):
    client.force_login(user_with_role("operator", "olga"))
    return client


def test_six_turns_at_a_fifth_held_out_keep_one_out_and_a_rebuild_keeps_it_out():
    keys = keys_on_the_train_side(6)
    built = training_set_create(name="fixes", items=turn_items(keys), heldout_fraction=0.2)
    # The hash alone holds none of these out; the nearest to the line is held out instead.
    nearest = min(keys, key=lambda k: hashlib.sha256(k.encode()).digest()[:8])
    assert (built.train_count, built.heldout_count) == (5, 1) and built.evaluable
    assert built.items.get(split=TrainingSplit.HELDOUT).key == nearest
    assert built.selection["held_out_to_evaluate"] == nearest

    # A later version with an item the hash holds out: the earlier test item stays held out,
    # so no candidate trained on v2 has seen what a v1 candidate was measured on.
    extra = next(f"new-{i}" for i in range(1000) if split_for(f"new-{i}", 0.2) == TrainingSplit.HELDOUT)
    again = training_set_create(name="fixes", items=turn_items([*keys, extra]), heldout_fraction=0.2)
    assert set(again.items.filter(split=TrainingSplit.HELDOUT).values_list("key", flat=True)) == {nearest, extra}
    assert "held_out_to_evaluate" not in again.selection


def sides(training_set) -> dict[str, str]:
    return dict(training_set.items.values_list("key", "split"))


def test_an_item_trained_on_in_one_version_is_never_held_out_in_the_next():
    # Two items the hash trains on: v1 holds out the nearer to the line (a) to be evaluable.
    a, b, c, d = sorted(keys_on_the_train_side(4), key=_fraction)
    v1 = training_set_create(name="moving", items=turn_items([a, b, d]), heldout_fraction=0.2)
    assert sides(v1) == {a: TrainingSplit.HELDOUT, b: TrainingSplit.TRAIN, d: TrainingSplit.TRAIN}
    # v2 drops a: b, which a v1 candidate trained on, stays on the train side although its
    # hash is now the nearest to the line; the new item c is held out instead.
    v2 = training_set_create(name="moving", items=turn_items([b, c]), heldout_fraction=0.2)
    assert sides(v2) == {b: TrainingSplit.TRAIN, c: TrainingSplit.HELDOUT}
    assert v2.selection["held_out_to_evaluate"] == c
    # With no new item to hold out, the version is built with nothing held out, and says so.
    v3 = training_set_create(name="moving", items=turn_items([b, d]), heldout_fraction=0.2)
    assert not v3.evaluable and sides(v3) == {b: TrainingSplit.TRAIN, d: TrainingSplit.TRAIN}
    v4 = training_set_create(name="moving", items=turn_items([a, b, c]), heldout_fraction=0.2)
    assert sides(v4) == {a: TrainingSplit.HELDOUT, b: TrainingSplit.TRAIN, c: TrainingSplit.HELDOUT}


def test_raising_the_share_holds_out_new_items_only():
    between = [k for k in (f"turn-{i}" for i in range(1000)) if 0.1 <= _fraction(k) < 0.5][:4]
    v1 = training_set_create(name="raised", items=turn_items(between), heldout_fraction=0.1)
    trained = {k for k, side in sides(v1).items() if side == TrainingSplit.TRAIN}
    assert trained and len(trained) >= 3
    new = next(f"new-{i}" for i in range(1000) if _fraction(f"new-{i}") < 0.5)
    v2 = training_set_create(name="raised", items=turn_items([*between, new]), heldout_fraction=0.5)
    assert {k for k, side in sides(v2).items() if side == TrainingSplit.TRAIN} == trained
    assert sides(v2)[new] == TrainingSplit.HELDOUT


def _fraction(key: str) -> float:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


def test_a_few_items_at_a_large_share_still_leave_one_to_train_on():
    keys = [k for k in (f"turn-{i}" for i in range(1000)) if split_for(k, 0.9) == TrainingSplit.HELDOUT][:3]
    built = training_set_create(name="most-out", items=turn_items(keys), heldout_fraction=0.9)
    assert (built.train_count, built.heldout_count) == (1, 2)


def test_a_set_that_cannot_hold_anything_out_is_marked_in_every_dropdown(operator_client, registry):  # noqa: F811
    lone = training_set_create(name="lone", items=turn_items(["only"]), heldout_fraction=0.2)
    none = training_set_create(name="all-in", items=turn_items(keys_on_the_train_side(4)), heldout_fraction=0.0)
    assert (lone.heldout_count, none.heldout_count) == (0, 0) and not lone.evaluable
    mark = "— 1 train / 0 held out (cannot be evaluated: nothing held out)"
    for url in (reverse("training:job-list"), reverse("promotion:models")):
        page = operator_client.get(url).content.decode()
        assert f"lone v1 {mark}" in page, url
        assert "all-in v1 — 4 train / 0 held out (cannot be evaluated" in page, url
    # A learning policy's "evaluate on" offers only sets that can be.
    assert "lone v1" not in operator_client.get(reverse("training:policy-list")).content.decode()


def test_the_build_says_what_it_built_and_takes_a_deployment_by_name(operator_client, registry):  # noqa: F811
    from feedback.models import Comment
    from tests.factories import TraceFactory
    from training.models import TrainingSet

    for i in range(2):
        trace = TraceFactory(deployment=registry.deployment, has_comment=True)
        turn = trace.messages.create(position=1, role="assistant", content=f"answer {i}")
        trace.messages.create(position=0, role="user", content="where is my order?")
        Comment.objects.create(trace=trace, message=turn, body="Look it up first.")
    response = operator_client.post(
        reverse("training:set-build"),
        {"name": "fixes", "filters": "comment=yes&deployment=support-bot", "heldout_fraction": "0.2"},
        follow=True,
    )
    built = TrainingSet.objects.get(name="fixes")
    assert built.item_count == 2 and built.heldout_count == 1
    assert f"Built fixes v1: {built.train_count} train / 1 held out." in response.content.decode()


def test_a_bad_build_comes_back_with_its_values_and_errors_by_label(operator_client):
    response = operator_client.post(
        reverse("training:set-build"), {"name": "my set", "heldout_fraction": "1.5", "filters": "comment=maybe"}
    )
    body = response.content.decode()
    assert response.status_code == 400
    summary = re.search(r'<div class="error-summary" role="alert" id="set-errors">(.*?)</div>', body, re.S).group(1)
    # In the order of the form, each linked to its field, in the label's words.
    assert summary.index("#set-name") < summary.index("#set-heldout-fraction") < summary.index("#set-filters")
    assert '<a href="#set-heldout-fraction">Held-out fraction</a>: must be a number from 0' in summary
    assert "heldout_fraction" not in summary and "filters." not in summary
    assert 'name="heldout_fraction" id="set-heldout-fraction" aria-invalid="true"' in body
    assert 'value="my set"' in body and 'value="1.5"' in body and 'value="comment=maybe"' in body


def test_json_errors_give_the_line_and_column():
    assert json_object_error('{"steps": 2,}') == (
        "not valid JSON at line 1, column 13: a comma with nothing after it (remove the trailing comma)"
    )
    assert json_object_error('{\n  "steps": 2\n  "beta": 0\n}').startswith("not valid JSON at line 3, column 3:")
    assert json_object_error("[1]") == "must be a JSON object ({…}), not a list"
    assert json_object_error("[" * 100_000) is not None and json_object_error('{"a": 1}') is None


def test_nested_names_become_the_labels_words():
    said = problems(
        [("config.monitors.kl_budget", "must be ≥ 0"), ("config.group_size", "at least 2"), ("source", "no turns")],
        labels={"group_size": "Group size", "config": "Other settings (JSON)"},
        prefix="job",
    )
    assert [str(p) for p in said] == [
        "no turns",
        "Group size: at least 2",
        "Other settings (JSON): monitors.kl_budget: must be ≥ 0",
    ]


def test_the_job_form_starts_from_the_live_version_and_says_what_the_method_can_use(
    operator_client,
    registry,  # noqa: F811
):
    assert registry.candidate.created_at >= registry.base_version.created_at  # the newest is the candidate
    corrected = training_set_create(
        name="ten", items=turn_items(keys_on_the_train_side(10, 0.01), corrected=1), heldout_fraction=0.0
    )
    url = reverse("training:job-list")
    page = operator_client.get(url + "?kind=sft").content.decode()
    live = re.search(r'<select name="base_version"[^>]*>(.*?)</select>', page, re.S).group(1)
    assert f'<option value="{registry.base_version.pk}" selected>' in live and "live on support-bot" in live
    assert f'<option value="{registry.candidate.pk}" selected>' not in live
    assert "<strong>Few items:</strong> 1 of 10 items usable by SFT on corrections" in page

    # The line follows the form's choices (htmx asks for it alone).
    part = operator_client.get(
        url, {"part": "usable", "kind": "distill", "training_set": corrected.pk}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert part.startswith('<p id="job-usable"') and "10 of 10 items usable by Self-distillation" in part
    assert "Few items" not in part

    form = {"kind": "sft", "base_version": registry.base_version.pk, "training_set": corrected.pk, "config": "{}"}
    started = operator_client.post(url, form | {"steps": "3"}, follow=True).content.decode()
    assert "trains on 1 of 10 items usable by SFT on corrections" in started
    assert TrainingJob.objects.get().base_version == registry.base_version


def test_a_job_form_error_keeps_every_value_and_names_the_json_position(operator_client, registry):  # noqa: F811
    training_set = training_set_create(name="ten", items=turn_items(keys_on_the_train_side(10)), heldout_fraction=0.2)
    form = {
        "kind": "distill",
        "base_version": registry.candidate.pk,
        "training_set": training_set.pk,
        "steps": "many",
        "learning_rate": "1e-5",
        "config": '{"eval_every": 2,}',
    }
    response = operator_client.post(reverse("training:job-list"), form)
    body = response.content.decode()
    assert response.status_code == 400 and not TrainingJob.objects.exists()
    assert '<a href="#job-steps">Steps</a>: must be a whole number' in body
    assert "Other settings (JSON)</a>: not valid JSON at line 1, column 18: a comma with nothing after it" in body
    assert f'<option value="{registry.candidate.pk}" selected>' in body  # what was chosen, not the default
    assert '<option value="distill" selected>' in body and 'value="1e-5"' in body
    assert "{&quot;eval_every&quot;: 2,}</textarea>" in body


def test_a_job_with_nothing_held_out_gives_an_eta_without_waiting_for_an_evaluation(
    operator_client,
    registry,  # noqa: F811
):
    from training.models import JobEventKind, TrainingJobEvent

    lone = training_set_create(name="all-in", items=turn_items(keys_on_the_train_side(4)), heldout_fraction=0.0)
    job = TrainingJob.objects.create(
        kind="grpo",
        status=WorkStatus.RUNNING,
        config={"kind": "grpo", "steps": 10, "eval_every": 5},
        base_version=registry.base_version,
        training_set=lone,
        step=4,
        total_steps=10,
        phase={"name": "sampling", "done": 0, "total": 0},
    )
    TrainingJobEvent.objects.create(job=job, kind=JobEventKind.STEP, step=4, data={"loss": 0.1, "step_seconds": 2.0})
    page = operator_client.get(reverse("training:job-detail", args=[job.pk])).content.decode()
    assert "estimated after the first evaluation" not in page
    assert "ETA 12 s" in page and "6 steps; nothing held out to evaluate on" in page


def test_a_finished_job_links_to_the_evaluation_form_filled_in(operator_client, registry):  # noqa: F811
    training_set = training_set_create(name="ten", items=turn_items(keys_on_the_train_side(10)), heldout_fraction=0.2)
    job = TrainingJob.objects.create(
        kind="sft",
        status=WorkStatus.FINISHED,
        config={"kind": "sft", "steps": 2},
        base_version=registry.base_version,
        training_set=training_set,
        deployment=registry.deployment,
        result_version=registry.candidate,
        step=2,
        total_steps=2,
    )
    page = operator_client.get(reverse("training:job-detail", args=[job.pk])).content.decode()
    link = re.search(r'<a class="button primary" id="evaluate-candidate" href="([^"]+)">Evaluate this candidate', page)
    href = link.group(1).replace("&amp;", "&")
    assert href == f"/models/?candidate=smol-v1&deployment=support-bot&training_set={training_set.pk}#evaluate"
    form = operator_client.get(href.split("#")[0]).content.decode()
    assert '<option value="smol-v1" selected>' in form and '<option value="support-bot" selected>' in form
    assert f'<option value="{training_set.pk}" selected>' in form


def test_the_evaluation_form_keeps_its_selections_when_it_is_refused(operator_client, registry):  # noqa: F811
    lone = training_set_create(name="all-in", items=turn_items(keys_on_the_train_side(4)), heldout_fraction=0.0)
    response = operator_client.post(
        reverse("promotion:evaluation-create"),
        {"candidate": "smol-v1", "deployment": "support-bot", "training_set": lone.pk, "max_tokens": "64"},
    )
    body = response.content.decode()
    assert response.status_code == 400 and not Evaluation.objects.exists()
    assert '<a href="#id_training_set">Held-out items of</a>: all-in v1 holds nothing out of training' in body
    assert '<option value="smol-v1" selected>' in body and f'<option value="{lone.pk}" selected>' in body
    assert 'value="64"' in body and 'aria-invalid="true"' in body

    response = operator_client.post(reverse("promotion:evaluation-create"), {"candidate": "", "trace_ids": "1, x"})
    body = response.content.decode()
    assert response.status_code == 400
    assert "Candidate</a>: This field is required." in body and "and/or traces</a>: whole numbers only" in body
    assert 'value="1, x"' in body


def test_a_promotion_refused_for_want_of_a_reason_says_so_at_the_top(operator_client, registry):  # noqa: F811
    regressing_job(registry)
    evaluation = glowing_evaluation(registry)
    form = {"candidate": "smol-v1", "deployment": "support-bot", "evaluation": evaluation.pk, "note": "wins"}
    response = operator_client.post(reverse("promotion:promotion-new"), form)
    body = response.content.decode()
    assert response.status_code == 400 and not PromotionRequest.objects.exists()
    summary = re.search(r'id="promotion-errors">(.*?)</div>', body, re.S).group(1)
    assert '<a href="#id_regression_override_reason">Promote despite a regressing signal because…</a>:' in summary
    assert "give a reason to override" in summary
    assert ">\nwins</textarea>" in body
