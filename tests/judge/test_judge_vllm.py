"""The judge against a real vLLM server, through structured output.

A 135M model is no judge (its rewards mean nothing); these tests prove the real path:
the schema is accepted and enforced by vLLM, the answer is parsed, validated and stored
— or, when the model rambles, the judgement fails visibly.
"""

from __future__ import annotations

import random

import pytest
from django.conf import settings

from feedback.judge.client import JudgeCallFailed, JudgeEndpoint
from feedback.judge.scoring import score_candidates
from feedback.models import DeploymentJudge, JudgeResult, JudgeStatus
from feedback.services.judging import judge_run
from feedback.services.review import comment_add
from training.inference.server import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def test_a_rambling_judge_on_real_vllm_fails_visibly(vllm_server):
    """The session's tiny model has random weights: under the JSON grammar it emits
    whitespace until max_tokens. vLLM accepts and enforces the schema (the answer opens
    the object the schema asks for), and the client fails the call instead of scoring."""
    endpoint = JudgeEndpoint(
        base_url=f"{vllm_server.url}/v1",
        model=vllm_server.served_name,
        api_key=vllm_server.api_key,
        max_attempts=2,
        backoff_s=0,
        max_tokens=64,
    )
    with pytest.raises(JudgeCallFailed) as info:
        score_candidates(
            [{"role": "user", "content": "Where is A1?"}],
            "Calls lookup_order first",
            ["It shipped.", "Let me look that up."],
            endpoint=endpoint,
            rng=random.Random(0),
        )
    record = info.value.record
    assert len(record.attempts) == 2 and record.completion_tokens > 0
    assert all(a.raw.startswith('{"scores"') for a in record.attempts)
    assert "cut off at max_tokens" in info.value.reason


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory):
    from training.inference.server import InferenceServer, ServerSpec, vllm_missing_reason
    from training.modelprep import smollm2_prepare

    reason = vllm_missing_reason()
    if reason:
        pytest.skip(reason)
    path = smollm2_prepare(settings.MODELS_DIR / "smollm2-135m-instruct")
    spec = ServerSpec(model_path=str(path), served_name="smollm2-judge", port=free_port(), max_model_len=2048)
    server = InferenceServer(spec, log_path=tmp_path_factory.mktemp("vllm-judge") / "server.log")
    server.start()
    try:
        server.wait_ready(timeout=600)
        yield spec
    finally:
        server.stop()


def test_smollm2_judges_a_commented_turn_through_structured_output(
    smollm2_server, make_trace, operator, settings, monkeypatch
):
    # Tight bounds: a 135M model repeats itself until a string's maxLength stops it.
    settings.JUDGE_RATIONALE_MAX_CHARS = 160
    settings.JUDGE_CORRECTION_MAX_CHARS = 160
    settings.JUDGE_MAX_CRITERIA = 2
    settings.JUDGE_MAX_TOKENS = 400
    settings.JUDGE_RETRY_BACKOFF_S = 0
    settings.JUDGE_TIMEOUT_S = 300
    settings.JUDGE_BASE_URL = ""  # only the deployment's own endpoint is configured
    trace = make_trace()
    # Our own vLLM wants its key: the deployment's endpoint names the variable holding it.
    monkeypatch.setenv("PRACTICUM_JUDGE_KEY_LOCAL_VLLM", smollm2_server.api_key)
    DeploymentJudge.objects.create(
        deployment=trace.deployment,
        base_url=f"{smollm2_server.url}/v1",
        model=smollm2_server.served_name,
        api_key_env="PRACTICUM_JUDGE_KEY_LOCAL_VLLM",
    )
    comment_add(message=trace.messages.get(position=4), author=operator, body="It should give the tracking number.")

    result = judge_run(result=JudgeResult.objects.get())

    print(
        f"\nSmolLM2 judge: {result.status}, reward {result.reward}, {result.latency_ms:.0f} ms, {result.call_attempts}"
    )
    assert result.status == JudgeStatus.SUCCEEDED, result.error
    assert 0.0 <= result.reward <= 1.0
    assert 1 <= len(result.rubric["criteria"]) <= 2
    assert result.judge_model == "smollm2-judge" and result.served_model == "smollm2-judge"
    assert result.raw_output.lstrip().startswith("{") and result.completion_tokens > 0
    assert result.is_latest
    assert type(result.trace).objects.get(pk=result.trace_id).judge_reward == result.reward
