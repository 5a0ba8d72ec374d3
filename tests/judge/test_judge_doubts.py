"""A judgement that passed the schema but reads as garbage is flagged, not shown as success."""

from __future__ import annotations

from feedback.models import JudgeResult, JudgeStatus
from feedback.selectors.judge import judge_result_doubts
from feedback.templatetags.judge_tags import reward_class

SOUND = {
    "status": JudgeStatus.SUCCEEDED,
    "rationale": "The agent guessed the status instead of calling lookup_order.",
    "rubric": {"criteria": [{"criterion": "Looks up the order first", "weight": 2}]},
    "call_attempts": [{"number": 1, "error": "", "raw": "{}", "finish_reason": "stop"}],
}


def test_a_sound_judgement_has_no_doubts():
    assert judge_result_doubts(JudgeResult(**SOUND)) == []


def test_garbled_words_retries_and_cut_output_are_doubts():
    result = JudgeResult(
        **{
            **SOUND,
            "rationale": "ok ok ok ok ok ok ok",
            "rubric": {"criteria": [{"criterion": "}}} ]] ::: 0 0 ~~", "weight": 1}, SOUND["rubric"]["criteria"][0]]},
            "call_attempts": [
                {"number": 1, "error": "not valid JSON", "raw": "{oops", "finish_reason": "stop"},
                {"number": 2, "error": "", "raw": "{}", "finish_reason": "length"},
            ],
        }
    )
    doubts = judge_result_doubts(result)
    assert doubts == [
        "the judge's first 1 answer(s) were rejected (not valid JSON)",
        "the accepted answer was cut off at the token limit",
        "the rationale is garbled",
        "1 of 2 rubric criteria are garbled",
    ]


def test_only_succeeded_judgements_are_doubted():
    assert judge_result_doubts(JudgeResult(**{**SOUND, "status": JudgeStatus.FAILED, "rationale": ""})) == []
    assert judge_result_doubts(JudgeResult(**{**SOUND, "status": JudgeStatus.PENDING, "rationale": ""})) == []


def test_the_reward_colour_follows_its_value():
    assert [reward_class(v) for v in (None, 0.0, 0.39, 0.4, 0.69, 0.7, 1.0)] == [
        "reward-none",
        "reward-low",
        "reward-low",
        "reward-mid",
        "reward-mid",
        "reward-high",
        "reward-high",
    ]
