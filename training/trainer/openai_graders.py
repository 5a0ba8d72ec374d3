"""OpenAI's fine-tuning graders as reward functions: `string_check`, `text_similarity` and
`multi` over them, evaluated on a sampled response and its training line.

A reinforcement fine-tuning job names one grader for the whole file; each line of the file
is an item whose fields the grader's templates read (`{{ item.reference_answer }}`), and
`{{ sample.output_text }}` is the sampled response. The `score_model` grader is the judge's
work and is mapped onto a judge rubric by the fine-tuning service, not here.

Django-free: the trainer scores with it, the web process validates with it.
"""

from __future__ import annotations

import ast
import difflib
import json
import math
import operator
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

STRING_OPERATIONS = ("eq", "ne", "like", "ilike")
SIMILARITY_METRICS = ("fuzzy_match", "bleu", "rouge_1", "rouge_2", "rouge_l")
_TEMPLATE = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*\}\}")
_MAX_EXPRESSION = 500
# A grader comes from a request and runs on every sample: its cost is bounded. At most this
# many placeholders per template, each filled with at most MAX_VALUE characters, and the
# similarity metrics (quadratic in the lengths) compare the first MAX_COMPARED characters.
MAX_PLACEHOLDERS = 16
MAX_VALUE = 20_000
MAX_COMPARED = 4_000


class GraderSpecError(ValueError):
    """A grader that cannot be run: (field, reason) pairs, fields named from the grader's root."""

    def __init__(self, errors: list[tuple[str, str]]):
        super().__init__("; ".join(f"{f}: {r}" for f, r in errors))
        self.errors = errors


def template_fields(template: str) -> list[str]:
    """The `item.…` paths a template reads (`{{ item.answer }}` → "answer")."""
    return [m.group(1)[5:] for m in _TEMPLATE.finditer(template) if m.group(1).startswith("item.")]


def render(template: str, *, output_text: str, item: dict[str, Any]) -> str:
    """`template` with `{{ sample.output_text }}`, `{{ sample.output_json.a.b }}` and
    `{{ item.a.b }}` filled in; a value that is not a string is written as JSON."""

    def value(match: re.Match) -> str:
        path = match.group(1).split(".")
        if path[0] == "sample" and path[1:2] == ["output_text"] and len(path) == 2:
            return output_text
        if path[0] == "sample" and path[1:2] == ["output_json"]:
            try:
                found: Any = json.loads(output_text)
            except (ValueError, RecursionError):
                return ""
            return _as_text(_lookup(found, path[2:]))
        if path[0] == "item":
            return _as_text(_lookup(item, path[1:]))
        return match.group(0)

    return _TEMPLATE.sub(lambda m: value(m)[:MAX_VALUE], template, count=MAX_PLACEHOLDERS)


def _lookup(value: Any, path: list[str]) -> Any:
    for part in path:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif (
            isinstance(value, list) and part.isascii() and part.isdigit() and len(part) < 10 and int(part) < len(value)
        ):
            value = value[int(part)]
        else:
            return None
    return value


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def spec_validate(spec: Any, *, field: str = "grader", nested: bool = False) -> None:
    """Raise GraderSpecError naming every field of `spec` that cannot be run."""
    errors: list[tuple[str, str]] = []
    _check(spec, field, nested, errors)
    if errors:
        raise GraderSpecError(errors)


def _check(spec: Any, field: str, nested: bool, errors: list[tuple[str, str]]) -> None:
    if not isinstance(spec, dict):
        errors.append((field, "must be an object"))
        return
    kind = spec.get("type")
    if kind in ("string_check", "text_similarity"):
        for key in ("input", "reference"):
            if not isinstance(spec.get(key), str):
                errors.append((f"{field}.{key}", "must be a string template"))
            elif len(_TEMPLATE.findall(spec[key])) > MAX_PLACEHOLDERS:
                errors.append((f"{field}.{key}", f"at most {MAX_PLACEHOLDERS} placeholders"))
        if kind == "string_check" and spec.get("operation") not in STRING_OPERATIONS:
            errors.append((f"{field}.operation", f"must be one of {', '.join(STRING_OPERATIONS)}"))
        if kind == "text_similarity" and spec.get("evaluation_metric") not in SIMILARITY_METRICS:
            errors.append((f"{field}.evaluation_metric", f"must be one of {', '.join(SIMILARITY_METRICS)} here"))
    elif kind == "multi" and nested:
        errors.append((f"{field}.type", "a multi grader's graders cannot be multi graders"))
    elif kind == "multi":
        graders = spec.get("graders")
        if not isinstance(graders, dict) or not graders:
            errors.append((f"{field}.graders", "must be an object of named graders"))
            return
        for name, inner in graders.items():
            if not name.isidentifier():
                errors.append((f"{field}.graders", f"{name!r} cannot be named in calculate_output"))
            _check(inner, f"{field}.graders.{name}", True, errors)
        expression = spec.get("calculate_output")
        if not isinstance(expression, str):
            errors.append((f"{field}.calculate_output", "must be a formula over the graders' names"))
        else:
            try:
                _compile(expression, set(graders))
            except ValueError as exc:
                errors.append((f"{field}.calculate_output", str(exc)))
    elif kind == "score_model" and nested:
        errors.append((f"{field}.type", "score_model is the judge's and cannot sit inside multi"))
    elif kind == "score_model":  # the fine-tuning service maps it onto the judge
        _check_score_model(spec, field, errors)
    elif kind in ("python", "label_model", "endpoint"):
        errors.append((f"{field}.type", f"{kind} graders are not run by this server"))
    else:
        errors.append((f"{field}.type", "must be string_check, text_similarity, score_model or multi"))


def _check_score_model(spec: dict[str, Any], field: str, errors: list[tuple[str, str]]) -> None:
    messages = spec.get("input")
    good = isinstance(messages, list) and 0 < len(messages) <= 16
    good = good and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str | list)
        for m in messages
    )
    if not good:
        errors.append((f"{field}.input", "must be a list of up to 16 messages with a role and a content"))
    elif sum(len(_TEMPLATE.findall(_content(m))) for m in messages) > MAX_PLACEHOLDERS:
        errors.append((f"{field}.input", f"at most {MAX_PLACEHOLDERS} placeholders"))
    bounds = spec.get("range", [0, 1])
    numbers = isinstance(bounds, list) and len(bounds) == 2
    numbers = numbers and all(isinstance(b, int | float) and not isinstance(b, bool) for b in bounds)
    if not (numbers and all(math.isfinite(b) for b in bounds) and bounds[0] < bounds[1]):
        errors.append((f"{field}.range", "must be two numbers, low then high"))


def item_fields(spec: dict[str, Any]) -> list[str]:
    """Every `item.…` path the grader's templates read, so each line can be checked for them."""
    if spec.get("type") == "multi":
        return [f for inner in spec["graders"].values() for f in item_fields(inner)]
    if spec.get("type") == "score_model":
        return [f for m in spec.get("input") or [] if isinstance(m, dict) for f in template_fields(_content(m))]
    return template_fields(spec.get("input", "")) + template_fields(spec.get("reference", ""))


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def grade(spec: dict[str, Any], *, output_text: str, item: dict[str, Any]) -> float:
    """The grader's score of `output_text` for the line `item` (spec already validated)."""
    kind = spec["type"]
    if kind == "multi":
        scores = {name: grade(inner, output_text=output_text, item=item) for name, inner in spec["graders"].items()}
        total = float(_compile(spec["calculate_output"], set(scores))(scores))
        return total if math.isfinite(total) else 0.0  # a reward is a number the loss can use
    given = render(spec["input"], output_text=output_text, item=item)
    reference = render(spec["reference"], output_text=output_text, item=item)
    if kind == "string_check":
        return _string_check(spec["operation"], given, reference)
    return SIMILARITY[spec["evaluation_metric"]](given[:MAX_COMPARED], reference[:MAX_COMPARED])


def _string_check(operation: str, given: str, reference: str) -> float:
    """eq / ne: exact (in)equality; like: `reference` occurs in `given`; ilike: the same,
    ignoring case."""
    if operation == "eq":
        return float(given == reference)
    if operation == "ne":
        return float(given != reference)
    if operation == "like":
        return float(reference in given)
    return float(reference.casefold() in given.casefold())


def fuzzy_match(given: str, reference: str) -> float:
    """difflib's ratio 2·M / (|a| + |b|), M the matched characters, in [0, 1]."""
    return difflib.SequenceMatcher(None, given, reference, autojunk=False).ratio()


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())


def _ngrams(words: list[str], n: int) -> Counter:
    return Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))


def bleu(given: str, reference: str) -> float:
    """Sentence BLEU-4 with add-one smoothing of the n-gram precisions for n > 1 (Lin and
    Och 2004): BP · exp(mean_n log p_n), BP = min(1, exp(1 - |ref| / |hyp|)), over
    lower-cased words."""
    hyp, ref = _words(given), _words(reference)
    if not hyp or not ref:
        return float(hyp == ref)
    logs = []
    for n in range(1, 5):
        h, r = _ngrams(hyp, n), _ngrams(ref, n)
        matched = sum(min(c, r[g]) for g, c in h.items())
        total = max(len(hyp) - n + 1, 0)
        if n == 1:
            if matched == 0:
                return 0.0
            logs.append(math.log(matched / total))
        else:
            logs.append(math.log((matched + 1) / (total + 1)))
    brevity = min(1.0, math.exp(1 - len(ref) / len(hyp)))
    return brevity * math.exp(sum(logs) / 4)


def _f1(matched: int, given: int, reference: int) -> float:
    if matched == 0:
        return 0.0
    precision, recall = matched / given, matched / reference
    return 2 * precision * recall / (precision + recall)


def rouge_n(n: int) -> Callable[[str, str], float]:
    def score(given: str, reference: str) -> float:
        """ROUGE-n F1 over lower-cased words."""
        h, r = _ngrams(_words(given), n), _ngrams(_words(reference), n)
        return _f1(sum((h & r).values()), sum(h.values()), sum(r.values()))

    return score


def rouge_l(given: str, reference: str) -> float:
    """ROUGE-L F1: the longest common word subsequence over both lengths."""
    a, b = _words(given), _words(reference)
    if not a or not b:
        return 0.0
    previous = [0] * (len(b) + 1)
    for x in a:
        row = [0]
        for j, y in enumerate(b):
            row.append(previous[j] + 1 if x == y else max(previous[j + 1], row[j]))
        previous = row
    return _f1(previous[-1], len(a), len(b))


SIMILARITY: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": fuzzy_match,
    "bleu": bleu,
    "rouge_1": rouge_n(1),
    "rouge_2": rouge_n(2),
    "rouge_l": rouge_l,
}

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_FUNCTIONS = {"min": min, "max": max, "abs": abs}


def _compile(expression: str, names: set[str]) -> Callable[[dict[str, float]], float]:
    """A `calculate_output` formula (numbers, the graders' names, + - * /, unary minus,
    min, max, abs, parentheses) as a function of the graders' scores. Anything else (an
    attribute, a power, a call of another name) is refused: the formula comes from a
    request."""
    if len(expression) > _MAX_EXPRESSION:
        raise ValueError(f"at most {_MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ValueError("is not a formula") from None

    def build(node: ast.AST) -> Callable[[dict[str, float]], float]:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            try:
                number = float(node.value)
            except OverflowError:
                raise ValueError("holds a number too large") from None
            if not math.isfinite(number):
                raise ValueError("holds a number too large")
            return lambda scores: number
        if isinstance(node, ast.Name) and node.id in names:
            name = node.id
            return lambda scores: scores[name]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right, op = build(node.left), build(node.right), _BINARY[type(node.op)]
            return lambda scores: _safe(op, left(scores), right(scores))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner, sign = build(node.operand), -1.0 if isinstance(node.op, ast.USub) else 1.0
            return lambda scores: sign * inner(scores)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS
            and node.args
            and not node.keywords
        ):
            fn, args = _FUNCTIONS[node.func.id], [build(a) for a in node.args]
            if fn is abs and len(args) != 1:
                raise ValueError("abs takes one value")
            if fn is not abs and len(args) < 2:
                raise ValueError(f"{node.func.id} takes two values or more")
            return lambda scores: float(fn(*(a(scores) for a in args)))
        if isinstance(node, ast.Name):
            raise ValueError(f"{node.id!r} is not one of the graders ({', '.join(sorted(names))})")
        raise ValueError("may use numbers, the graders' names, + - * /, min, max and abs only")

    return build(tree.body)


def _safe(op, left: float, right: float) -> float:
    try:
        return float(op(left, right))
    except (ZeroDivisionError, OverflowError):
        return 0.0


def grade_reference(response: str, reference: str) -> float:
    """The trainer's grader signature (response, reference): `reference` is the JSON
    `{"grader": spec, "item": line}` of a fine-tuning item. A stored grader that cannot run
    (an item made by hand, not by the fine-tuning service) raises ValueError, which fails
    the job with its reason, rather than rewarding every sample 0."""
    try:
        stored = json.loads(reference)
        spec, item = stored["grader"], stored["item"]
    except (ValueError, KeyError, TypeError):
        raise ValueError('an item\'s grader "openai" needs the reference {"grader": …, "item": …}') from None
    if not isinstance(item, dict):
        raise ValueError('an item\'s grader "openai" needs its line as an object')
    try:
        spec_validate(spec, field="grader")
    except GraderSpecError as exc:
        raise ValueError(f"the item's grader cannot run: {exc}") from None
    return grade(spec, output_text=response, item=item)
