"""OpenAI's grader types as reward functions, each against a hand computation; a formula
from a request can only do arithmetic on the graders' scores."""

from __future__ import annotations

import json
import math

import pytest

from training.trainer import openai_graders as G
from training.trainer.graders import grade


def check(operation: str, reference: str = "{{ item.id }}") -> dict:
    return {"type": "string_check", "input": "{{ sample.output_text }}", "reference": reference, "operation": operation}


@pytest.mark.parametrize(
    ("operation", "text", "expected"),
    [
        ("eq", "A1", 1.0),
        ("eq", "a1", 0.0),
        ("ne", "A2", 1.0),
        ("like", "order A1 shipped", 1.0),
        ("like", "order a1 shipped", 0.0),
        ("ilike", "order a1 shipped", 1.0),
        ("ilike", "order B1", 0.0),
    ],
)
def test_string_check(operation, text, expected):
    assert G.grade(check(operation), output_text=text, item={"id": "A1"}) == expected


HYP, REF = "the cat sat on the mat", "the cat sat on a mat"


def similarity(metric: str) -> dict:
    return {
        "type": "text_similarity",
        "input": "{{ sample.output_text }}",
        "reference": REF,
        "evaluation_metric": metric,
    }


def test_text_similarity_by_hand():
    assert G.fuzzy_match("abcd", "abce") == pytest.approx(2 * 3 / 8)  # 2·matched / (|a| + |b|)
    # BLEU-4: unigrams 5/6 (one "the" too many), bigrams (3+1)/(5+1), trigrams (2+1)/(4+1),
    # 4-grams (1+1)/(3+1), equal lengths so no brevity penalty.
    expected = (5 / 6 * 4 / 6 * 3 / 5 * 2 / 4) ** 0.25
    assert G.grade(similarity("bleu"), output_text=HYP, item={}) == pytest.approx(expected)
    # Every n-gram of a 3-word prefix matches (smoothed 1/1 where there are none), so only the
    # brevity penalty exp(1 - 6/3) is left.
    assert G.bleu("the cat sat", "the cat sat on the mat") == pytest.approx(math.exp(1 - 6 / 3))
    assert G.grade(similarity("rouge_1"), output_text=HYP, item={}) == pytest.approx(5 / 6)
    assert G.grade(similarity("rouge_2"), output_text=HYP, item={}) == pytest.approx(3 / 5)
    assert G.grade(similarity("rouge_l"), output_text=HYP, item={}) == pytest.approx(5 / 6)  # LCS "the cat sat on mat"
    assert G.bleu("", "") == 1.0 and G.bleu("x", "") == 0.0 and G.rouge_l("", "a") == 0.0


def test_multi_combines_named_scores_with_the_requests_formula():
    spec = {
        "type": "multi",
        "graders": {"exact": check("eq"), "near": {**similarity("fuzzy_match"), "reference": "{{ item.id }}"}},
        "calculate_output": "0.5 * exact + 0.5 * near - min(exact, 0.1) / 2",
    }
    G.spec_validate(spec)
    # "A1" vs "A1": exact 1, fuzzy 1 → 0.5 + 0.5 - 0.05.
    assert G.grade(spec, output_text="A1", item={"id": "A1"}) == pytest.approx(0.95)
    # "A2" vs "A1": exact 0, fuzzy 2·1/4 → 0.25.
    assert G.grade(spec, output_text="A2", item={"id": "A1"}) == pytest.approx(0.25)
    assert G.grade({**spec, "calculate_output": "exact / 0"}, output_text="A1", item={"id": "A1"}) == 0.0


@pytest.mark.parametrize(
    "formula",
    [
        "exact.__class__",
        "2 ** 3",
        "__import__('os')",
        "unknown + 1",
        "exact if exact else 1",
        "x" * 600,
        "[exact]",
        "abs(exact, 1)",
    ],
)
def test_a_formula_is_arithmetic_on_the_graders_and_nothing_else(formula):
    spec = {"type": "multi", "graders": {"exact": check("eq")}, "calculate_output": formula}
    with pytest.raises(G.GraderSpecError) as refused:
        G.spec_validate(spec, field="grader")
    assert refused.value.errors[0][0] == "grader.calculate_output"


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"type": "python", "source": "import os"}, "g.type"),
        ({"type": "string_check", "input": "x", "reference": 3, "operation": "eq"}, "g.reference"),
        ({"type": "string_check", "input": "x", "reference": "y", "operation": "regex"}, "g.operation"),
        (
            {"type": "text_similarity", "input": "x", "reference": "y", "evaluation_metric": "meteor"},
            "g.evaluation_metric",
        ),
        ({"type": "multi", "graders": {"j": {"type": "score_model"}}, "calculate_output": "j"}, "g.graders.j.type"),
        ("not a grader", "g"),
    ],
)
def test_a_grader_that_cannot_run_is_named(spec, field):
    with pytest.raises(G.GraderSpecError) as refused:
        G.spec_validate(spec, field="g")
    assert refused.value.errors[0][0] == field


def test_templates_read_the_line_and_the_sample():
    item = {"order": {"id": "A1", "lines": [{"sku": "X"}]}, "n": 3}
    assert G.render("{{item.order.id}}/{{ item.order.lines.0.sku }}/{{item.n}}", output_text="", item=item) == "A1/X/3"
    assert G.render("{{ sample.output_json.a }}", output_text='{"a": "b"}', item={}) == "b"
    assert G.render("{{ sample.output_json.a }}", output_text="not json", item={}) == ""
    assert G.render("{{ item.missing }}", output_text="", item={}) == ""
    assert G.item_fields(
        {"type": "multi", "graders": {"a": check("eq", "{{ item.x.y }}")}, "calculate_output": "a"}
    ) == ["x.y"]


def test_the_trainer_reads_a_stored_grader_by_name():
    reference = json.dumps({"grader": check("ilike"), "item": {"id": "A1"}})
    assert grade("openai", "Order a1 is refunded", reference) == 1.0
    assert grade("openai", "Order B2", reference) == 0.0


@pytest.mark.parametrize("formula", ["9" * 400 + " * exact", "1e999 * exact", "min(exact)", "max(exact)"])
def test_a_formula_that_would_break_the_trainer_is_refused_up_front(formula):
    with pytest.raises(G.GraderSpecError):
        G.spec_validate({"type": "multi", "graders": {"exact": check("eq")}, "calculate_output": formula})


def test_a_score_that_is_not_a_number_the_loss_can_use_is_zero():
    spec = {"type": "multi", "graders": {"e": check("eq")}, "calculate_output": "1e308 * 10 * e - 1e308 * 10 * e"}
    G.spec_validate(spec)
    assert G.grade(spec, output_text="A1", item={"id": "A1"}) == 0.0


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {
                "type": "multi",
                "graders": {"m": {"type": "multi", "graders": {"e": check("eq")}, "calculate_output": "e"}},
                "calculate_output": "m",
            },
            "g.graders.m.type",
        ),
        ({"type": "score_model", "input": "plain", "range": [0, 1]}, "g.input"),
        ({"type": "score_model", "input": ["x"]}, "g.input"),
        ({"type": "score_model", "input": [{"role": "user", "content": "ok?"}], "range": 5}, "g.range"),
        ({"type": "score_model", "input": [{"role": "user", "content": "ok?"}], "range": [1]}, "g.range"),
        ({"type": "score_model", "input": [{"role": "user", "content": "ok?"}], "range": [1, 0]}, "g.range"),
        ({**check("eq", "{{ item.a }}" * 17)}, "g.reference"),
    ],
)
def test_a_grader_of_the_wrong_shape_or_size_is_named(spec, field):
    with pytest.raises(G.GraderSpecError) as refused:
        G.spec_validate(spec, field="g")
    assert refused.value.errors[0][0] == field


def test_one_samples_grading_is_bounded_whatever_the_line_holds():
    import time

    spec = {**similarity("fuzzy_match"), "reference": "{{ item.answer }}"}
    started = time.perf_counter()
    G.grade(spec, output_text="ab" * 1000, item={"answer": "ba" * 50_000})
    assert time.perf_counter() - started < 5  # compared on the first 4,000 characters, not 100,000
    assert len(G.render("{{ item.a }}" * 40, output_text="", item={"a": "x" * 50_000})) <= 16 * 20_000 + 24 * 12


def test_a_stored_grader_that_cannot_run_fails_the_job_with_its_reason():
    with pytest.raises(ValueError, match="cannot run"):
        grade("openai", "x", json.dumps({"grader": {"type": "string_check"}, "item": {}}))
    with pytest.raises(ValueError, match="needs the reference"):
        grade("openai", "x", "not json")
