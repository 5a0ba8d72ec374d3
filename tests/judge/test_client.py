"""The judge client over real HTTP: structured output, retries, failures, cost."""

from __future__ import annotations

import json
import random
import time

import pytest

from feedback.judge.client import JudgeCallFailed, JudgeEndpoint, JudgeNotConfigured, call_structured, portable_schema
from feedback.judge.schemas import TURN_JUDGEMENT_SCHEMA, parse_turn_judgement
from tests.fixtures.judge import Reply
from tests.judge.conftest import VALID_JUDGEMENT

MESSAGES = [{"role": "system", "content": "judge"}, {"role": "user", "content": "judge this"}]


def call(endpoint):
    return call_structured(
        endpoint=endpoint,
        messages=MESSAGES,
        schema_name="turn_judgement",
        schema=TURN_JUDGEMENT_SCHEMA,
        parse=parse_turn_judgement,
    )


def test_valid_output_is_parsed_and_the_request_asks_for_the_schema(judge_server):
    judge_server.script(Reply.json(VALID_JUDGEMENT, usage={"prompt_tokens": 1200, "completion_tokens": 300}))
    result = call(judge_server.endpoint(price_input_per_mtok=2.5, price_output_per_mtok=10.0))

    assert result.value.reward == pytest.approx(0.2)
    assert result.value.rubric.criteria[0].weight == 3
    assert result.value.corrected_response == "Let me check order A1 for you."
    assert result.record.usage == {"prompt_tokens": 1200, "completion_tokens": 300}
    assert result.record.cost == pytest.approx((1200 * 2.5 + 300 * 10.0) / 1e6)
    assert len(result.record.attempts) == 1 and result.record.attempts[0].error == ""

    (request,) = judge_server.requests
    assert request["model"] == "test-judge"
    assert request["temperature"] == 0.0
    fmt = request["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "turn_judgement"
    assert fmt["json_schema"]["schema"] == TURN_JUDGEMENT_SCHEMA
    assert judge_server.headers[0]["authorization"] == "Bearer test-key"


def test_transient_http_errors_and_malformed_output_are_retried(judge_server):
    judge_server.script(Reply.error(503), Reply.text('{"rubric": '), Reply.json(VALID_JUDGEMENT))
    result = call(judge_server.endpoint(max_attempts=3))
    assert result.value.reward == pytest.approx(0.2)
    errors = [a.error for a in result.record.attempts]
    assert errors[0].startswith("HTTP 503")
    assert errors[1].startswith("output is not JSON")
    assert errors[2] == ""
    assert result.record.attempts[1].raw == '{"rubric": '


def test_malformed_output_fails_visibly_after_the_last_attempt(judge_server):
    bad_reward = {**VALID_JUDGEMENT, "reward": 1.7}
    judge_server.script(Reply.text("Sure! The reward is 0.8."), Reply.json(bad_reward), Reply.text(""))
    with pytest.raises(JudgeCallFailed) as info:
        call(judge_server.endpoint(max_attempts=3))
    failure = info.value
    assert "after 3 attempts" in failure.reason
    assert "empty output" in failure.reason
    reasons = [a.error for a in failure.record.attempts]
    assert reasons[0].startswith("output is not JSON")
    assert reasons[1].startswith("output does not match the schema: reward")
    assert failure.record.attempts[0].raw == "Sure! The reward is 0.8."
    assert judge_server.pending == 0


def test_cut_off_output_and_refusals_are_retried(judge_server):
    judge_server.script(
        Reply.json(VALID_JUDGEMENT, finish_reason="length"), Reply.refusal("I can't"), Reply.json(VALID_JUDGEMENT)
    )
    result = call(judge_server.endpoint())
    assert [a.error.split(" ")[0] for a in result.record.attempts] == ["output", "the", ""]
    assert "max_tokens" in result.record.attempts[0].error
    assert "refused" in result.record.attempts[1].error


def test_client_errors_are_not_retried(judge_server):
    judge_server.script(Reply.error(401, '{"error": {"message": "bad key"}}'), Reply.json(VALID_JUDGEMENT))
    with pytest.raises(JudgeCallFailed) as info:
        call(judge_server.endpoint())
    assert "HTTP 401" in info.value.reason and "bad key" in info.value.reason
    assert len(info.value.record.attempts) == 1
    assert judge_server.pending == 1


def test_a_slow_judge_times_out_and_is_retried(judge_server):
    judge_server.script(Reply.json(VALID_JUDGEMENT).after(1.5), Reply.json(VALID_JUDGEMENT))
    result = call(judge_server.endpoint(timeout_s=0.5))
    assert result.record.attempts[0].error == "timed out after 0.5 s"
    assert result.record.attempts[1].error == ""


def test_an_unreachable_judge_fails_with_the_reason():
    endpoint = JudgeEndpoint(base_url="http://127.0.0.1:9/v1", model="m", max_attempts=2, backoff_s=0, timeout_s=2)
    with pytest.raises(JudgeCallFailed) as info:
        call(endpoint)
    assert info.value.detail.startswith("connection failed")
    assert info.value.reason.startswith("the judge endpoint does not answer")
    assert len(info.value.record.attempts) == 2


def test_portable_mode_sends_bounds_free_schema_but_still_checks_bounds(judge_server):
    too_long = {**VALID_JUDGEMENT, "rationale": "x" * 900}
    judge_server.script(Reply.json(too_long), Reply.json(VALID_JUDGEMENT))
    result = call(judge_server.endpoint(schema_mode="portable"))
    sent = judge_server.requests[0]["response_format"]["json_schema"]["schema"]
    assert sent == portable_schema(TURN_JUDGEMENT_SCHEMA)
    assert "maxLength" not in str(sent) and "maximum" not in str(sent)
    assert "rationale" in result.record.attempts[0].error


def test_missing_configuration_is_reported(settings):
    settings.JUDGE_BASE_URL = ""
    with pytest.raises(JudgeNotConfigured, match="PRACTICUM_JUDGE_BASE_URL"):
        JudgeEndpoint.from_settings()


def test_a_200_that_is_not_a_chat_completion_is_a_retryable_failure(judge_server):
    judge_server.script(
        Reply.raw(b'{"id": "chatcmpl-1", "object": "chat.completion", "choi'),  # cut off
        Reply.raw(b"<html><body>502 Bad Gateway</body></html>", content_type="text/html"),
        Reply.raw(b'{"id": "x", "choices": [{"index": 0}]}'),  # JSON, but no message
        Reply.json(VALID_JUDGEMENT),
    )
    result = call(judge_server.endpoint(max_attempts=4))
    assert result.value.reward == pytest.approx(0.2)
    errors = [a.error for a in result.record.attempts]
    assert all(e.startswith("the response is not a chat completion") for e in errors[:3]), errors
    assert "502 Bad Gateway" in errors[1] and errors[3] == ""


def test_json_nested_too_deeply_is_a_failure_in_words_not_a_crash(judge_server):
    deep = "[" * 200_000
    judge_server.script(Reply.error(400, deep))
    with pytest.raises(JudgeCallFailed) as info:
        call(judge_server.endpoint())
    assert "The judge said: HTTP 400: [[[" in info.value.reason and len(info.value.record.attempts) == 1
    judge_server.script(Reply.raw(deep.encode()), Reply.text(deep), Reply.json(VALID_JUDGEMENT))
    result = call(judge_server.endpoint(max_attempts=3))
    errors = [a.error for a in result.record.attempts]
    assert errors[0].startswith("the response is not a chat completion (not JSON)")
    assert errors[1] == "output is not JSON: nested too deeply to read" and errors[2] == ""


def test_a_trickled_body_cannot_outlive_the_attempts_time_limit(judge_server):
    # Each piece arrives well within the per-read timeout; the whole takes 6 s.
    judge_server.script(Reply.json(VALID_JUDGEMENT).trickle(6.0), Reply.json(VALID_JUDGEMENT))
    started = time.monotonic()
    result = call(judge_server.endpoint(timeout_s=1.0))
    assert time.monotonic() - started < 4.0
    first = result.record.attempts[0]
    assert first.error == "timed out after 1 s" and first.latency_ms < 2500
    assert result.record.attempts[1].error == ""


def test_every_call_has_a_total_deadline(judge_server):
    judge_server.respond_with(lambda request: Reply.json(VALID_JUDGEMENT).trickle(6.0))
    started = time.monotonic()
    with pytest.raises(JudgeCallFailed) as info:
        call(judge_server.endpoint(timeout_s=1.0, deadline_s=2.0, max_attempts=5))
    assert time.monotonic() - started < 4.0
    assert "deadline 2 s" in info.value.reason or "pass the deadline" in info.value.reason
    assert len(info.value.record.attempts) <= 3


def test_retry_after_is_honoured_and_waits_have_jitter(judge_server):
    waits: list[float] = []
    judge_server.script(Reply.error(429).with_headers(retry_after="1.5"), Reply.json(VALID_JUDGEMENT))
    call_structured(
        endpoint=judge_server.endpoint(backoff_s=0.2),
        messages=MESSAGES,
        schema_name="turn_judgement",
        schema=TURN_JUDGEMENT_SCHEMA,
        parse=parse_turn_judgement,
        sleep=waits.append,
    )
    assert len(waits) == 1 and 1.5 <= waits[0] <= 1.65

    # Without Retry-After: the backoff, half of it random.
    seen = set()
    for seed in range(5):
        judge_server.script(Reply.error(503), Reply.json(VALID_JUDGEMENT))
        waits.clear()
        call_structured(
            endpoint=judge_server.endpoint(backoff_s=1.0),
            messages=MESSAGES,
            schema_name="turn_judgement",
            schema=TURN_JUDGEMENT_SCHEMA,
            parse=parse_turn_judgement,
            sleep=waits.append,
            rng=random.Random(seed),
        )
        assert 0.5 <= waits[0] <= 1.0
        seen.add(round(waits[0], 6))
    assert len(seen) == 5


def test_a_retry_after_past_the_deadline_fails_at_once(judge_server):
    judge_server.script(Reply.error(503).with_headers(retry_after="120"), Reply.json(VALID_JUDGEMENT))
    waits: list[float] = []
    with pytest.raises(JudgeCallFailed) as info:
        call_structured(
            endpoint=judge_server.endpoint(deadline_s=10.0),
            messages=MESSAGES,
            schema_name="turn_judgement",
            schema=TURN_JUDGEMENT_SCHEMA,
            parse=parse_turn_judgement,
            sleep=waits.append,
        )
    assert waits == [] and "pass the deadline" in info.value.reason
    assert judge_server.pending == 1


def test_a_malformed_answer_is_asked_for_again_with_the_reason(judge_server):
    bad = json.dumps({**VALID_JUDGEMENT, "reward": 1.7})
    judge_server.script(Reply.text(bad), Reply.error(503), Reply.json(VALID_JUDGEMENT))
    result = call(judge_server.endpoint(max_attempts=3))
    assert result.value.reward == pytest.approx(0.2)
    first, second, third = (r["messages"] for r in judge_server.requests)
    assert first == MESSAGES
    # The re-ask shows the refused answer and the validation error, not the same prompt again.
    assert second[: len(MESSAGES)] == MESSAGES and second[-2] == {"role": "assistant", "content": bad}
    assert second[-1]["role"] == "user" and "reward: 1.7 is greater than the maximum of 1" in second[-1]["content"]
    # A transport failure (503) is sent again as it was: nothing was wrong with the prompt.
    assert third == MESSAGES


def _padded_completion(size: int) -> bytes:
    """A valid chat completion carrying `size` bytes of padding in an extra field."""
    completion = {
        "id": "chatcmpl-big",
        "object": "chat.completion",
        "created": 0,
        "model": "test-judge",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": json.dumps(VALID_JUDGEMENT)},
                "finish_reason": "stop",
            }
        ],
        "padding": "x" * size,
    }
    return json.dumps(completion).encode()


def test_a_response_body_over_the_size_cap_fails_the_call_without_reading_it_all(judge_server):
    huge = _padded_completion(3_000_000)
    judge_server.script(Reply.raw(huge), Reply.raw(huge), Reply.raw(huge))
    with pytest.raises(JudgeCallFailed) as failed:
        call(judge_server.endpoint())
    assert failed.value.detail == (
        "the response body is larger than 2000000 bytes (PRACTICUM_JUDGE_MAX_RESPONSE_BYTES): "
        "it was not read further (after 1 attempt)"
    )
    assert len(failed.value.record.attempts) == 1  # a hostile or broken endpoint is not asked again


def test_an_error_response_over_the_size_cap_is_not_read_either(judge_server):
    judge_server.script(Reply.raw(_padded_completion(3_000_000), status=500))
    with pytest.raises(JudgeCallFailed) as failed:
        call(judge_server.endpoint(max_response_bytes=1_000_000))
    assert "larger than 1000000 bytes" in failed.value.reason


def test_a_response_under_the_cap_is_read_whole(judge_server):
    judge_server.script(Reply.raw(_padded_completion(500_000)))
    assert call(judge_server.endpoint(max_response_bytes=600_000)).value.reward == pytest.approx(0.2)


def test_the_cap_is_a_setting(settings):
    settings.JUDGE_BASE_URL, settings.JUDGE_MODEL = "http://judge.invalid/v1", "m"
    settings.JUDGE_MAX_RESPONSE_BYTES = 123_456
    assert JudgeEndpoint.from_settings().max_response_bytes == 123_456


def test_a_compressed_error_body_is_capped_as_it_is_decoded(judge_server):
    import gzip

    bomb = gzip.compress(b" " * 20_000_000)  # about 20 kB on the wire, 20 MB decoded
    judge_server.script(Reply.raw(bomb, status=500).with_headers(content_encoding="gzip"))
    with pytest.raises(JudgeCallFailed) as failed:
        call(judge_server.endpoint())
    assert "larger than 2000000 bytes" in failed.value.reason


def test_a_gzip_answer_within_the_cap_is_read(judge_server):
    import gzip

    judge_server.script(Reply.raw(gzip.compress(_padded_completion(1000))).with_headers(content_encoding="gzip"))
    assert call(judge_server.endpoint()).value.reward == pytest.approx(0.2)


def test_a_body_in_a_compression_nobody_asked_for_is_not_read(judge_server):
    judge_server.script(Reply.raw(b"\x8b\x00\x80" * 1000).with_headers(content_encoding="br"))
    with pytest.raises(JudgeCallFailed) as failed:
        call(judge_server.endpoint())
    assert failed.value.detail.startswith("the response body is compressed with 'br', which was not asked for")
    assert len(judge_server.headers) == 1 and judge_server.headers[0]["accept-encoding"] == "identity"
