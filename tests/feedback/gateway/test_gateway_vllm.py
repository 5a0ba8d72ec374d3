"""The completion gateway with the real openai SDK, in front of a real vLLM server (tiny model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest

from feedback.models import Message, Trace, TraceSource
from tests.fixtures.adapters import LOOKUP_TOOL, TOOL_CALL_TEXT
from training.inference.server import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.postgres]


def trace_messages(external_id: str) -> list[Message]:
    trace = Trace.objects.get(external_id=external_id)
    return list(trace.messages.order_by("position"))


def test_tool_call_conversation_through_the_gateway_is_one_trace_in_order(
    gateway, openai_client, deployment, tool_call_version
):
    from training.serving.services import live_version_set

    live_version_set(deployment=deployment, version=tool_call_version)
    headers = {"X-Practicum-Trace-Id": "conv-42"}
    history = [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": "Where is my order A1001?"},
    ]
    first = openai_client.chat.completions.create(
        model="whatever-the-agent-calls-it",
        messages=history,
        tools=[LOOKUP_TOOL],
        temperature=0,
        max_tokens=48,
        extra_headers=headers,
    )
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == ("lookup_order", {"order_id": "A1001"})
    assert first.choices[0].logprobs is None  # not asked for, so not returned (but logged)

    history += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"status": "shipped"}'},
    ]
    raw = openai_client.chat.completions.with_raw_response.create(
        model="whatever-the-agent-calls-it",
        messages=history,
        tools=[LOOKUP_TOOL],
        temperature=0,
        max_tokens=48,
        extra_headers=headers,
    )
    second = raw.parse()
    assert raw.headers["x-practicum-trace-id"] == "conv-42"
    gateway.drain()

    trace = Trace.objects.get(external_id="conv-42")
    assert (trace.source, trace.deployment_id, trace.model_version_id) == (
        TraceSource.GATEWAY,
        deployment.id,
        tool_call_version.id,
    )
    assert trace.model_name == "whatever-the-agent-calls-it"
    assert trace.tools == [LOOKUP_TOOL]
    messages = trace_messages("conv-42")
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert (trace.message_count, trace.assistant_turn_count, trace.tool_call_count) == (5, 2, 2)
    assert messages[3].tool_call_id == call.id and messages[3].content == '{"status": "shipped"}'
    for message, response in ((messages[2], first), (messages[4], second)):
        assert message.response_id == response.id
        assert message.model_version_id == tool_call_version.id
        assert message.finish_reason == "tool_calls"
        assert message.tool_calls[0]["function"]["name"] == "lookup_order"
        assert message.usage["completion_tokens"] == response.usage.completion_tokens
        assert len(message.token_ids) == len(message.token_logprobs) == response.usage.completion_tokens
        assert all(lp <= 0 for lp in message.token_logprobs)
        assert message.latency_ms > 0
    assert messages[2].tool_calls[0]["id"] == call.id


def test_streaming_passes_chunks_through_and_logs_the_turn(gateway, openai_client, base_live):
    stream = openai_client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Tell me a story"}],
        stream=True,
        max_tokens=12,
        temperature=0,
        extra_headers={"X-Practicum-Trace-Id": "story-1"},
    )
    chunks = list(stream)
    assert len(chunks) > 2
    assert all(c.choices for c in chunks)  # no usage-only chunk: the client did not ask for one
    assert all(c.choices[0].logprobs is None for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    gateway.drain()
    user, assistant = trace_messages("story-1")
    assert (user.role, assistant.role) == ("user", "assistant")
    assert assistant.content == text
    assert assistant.response_id == chunks[0].id
    assert assistant.finish_reason == "length"
    assert len(assistant.token_ids) == len(assistant.token_logprobs) == 12
    assert assistant.usage["completion_tokens"] == 12
    assert assistant.raw["practicum"]["ttft_ms"] <= assistant.latency_ms


def test_streaming_with_usage_and_logprobs_when_the_client_asks(gateway, openai_client, base_live):
    chunks = list(
        openai_client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            max_tokens=5,
            logprobs=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage.completion_tokens == 5 and not chunks[-1].choices
    assert sum(len(c.choices[0].logprobs.content) for c in chunks if c.choices and c.choices[0].logprobs) == 5


def test_bad_key_is_401_and_a_malformed_body_is_400_with_the_reason(gateway, api_key, base_live):
    bad = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="prk_nope_nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as exc:
        bad.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert exc.value.status_code == 401
    assert httpx.post(f"{gateway.url}/v1/chat/completions", json={}).status_code == 401

    good = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        good.chat.completions.create(model="m", messages=[{"role": "robot", "content": "hi"}])
    body = exc.value.body
    assert body["param"] == "messages[0].role" and "unknown role" in body["message"]

    r = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        content=b'{"messages": [',
        headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
    )
    assert r.status_code == 400
    assert r.json()["errors"][0]["field"] == "body" and "not valid JSON" in r.json()["detail"]

    # An error the inference server finds (too many tokens) keeps its status and reason.
    with pytest.raises(openai.BadRequestError) as exc:
        good.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=100000)
    assert "max_tokens" in exc.value.body["message"]
    gateway.drain()
    assert Trace.objects.count() == 1  # the refused-upstream call is logged, the invalid bodies are not
    assert Trace.objects.get().messages.last().finish_reason == "error"


def test_models_lists_the_live_version(gateway, openai_client, base_live):
    models = openai_client.models.list()
    assert [m.id for m in models.data] == [base_live.name]


def test_switching_the_live_version_changes_the_weights_without_a_restart(
    gateway, openai_client, deployment, base_live, tool_call_version, vllm_server
):
    from training.serving.services import live_version_set

    pid = vllm_server.server.process.pid
    ask = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 30, "temperature": 0}
    before = openai_client.chat.completions.create(**ask, logprobs=True)
    live_version_set(deployment=deployment, version=tool_call_version)
    after = openai_client.chat.completions.create(**ask, logprobs=True)
    assert before.model == base_live.name and after.model == tool_call_version.name
    assert after.choices[0].message.content == TOOL_CALL_TEXT
    assert before.choices[0].message.content != TOOL_CALL_TEXT
    assert vllm_server.server.process.pid == pid
    gateway.drain()
    served = list(Message.objects.filter(role="assistant").order_by("id").values_list("model_version_id", flat=True))
    assert served == [base_live.id, tool_call_version.id]


def test_n_choices_are_all_logged_and_continuing_with_any_one_extends_its_trace(gateway, openai_client, base_live):
    headers = {"X-Practicum-Trace-Id": "sampled"}
    history = [{"role": "user", "content": "Pick a number"}]
    r = openai_client.chat.completions.create(
        model="m", messages=history, n=2, max_tokens=6, temperature=1.0, seed=3, extra_headers=headers
    )
    assert len(r.choices) == 2 and r.choices[0].message.content != r.choices[1].message.content
    chosen = r.choices[1].message
    history += [{"role": "assistant", "content": chosen.content}, {"role": "user", "content": "Again"}]
    openai_client.chat.completions.create(model="m", messages=history, max_tokens=4, extra_headers=headers)
    gateway.drain()
    main = Trace.objects.get(external_id="sampled")
    fork = Trace.objects.exclude(pk=main.pk).get()
    assert [m.content for m in main.messages.order_by("position")][1] == r.choices[0].message.content
    fork_messages = list(fork.messages.order_by("position"))
    assert [m.role for m in fork_messages] == ["user", "assistant", "user", "assistant"]
    assert fork_messages[1].content == chosen.content and fork_messages[1].response_id == r.id
    assert fork.metadata["forked_from"] == "sampled" and fork.session_id == "sampled"


@pytest.fixture
def relay_to(vllm_server):
    """Start a relay to the vLLM server with these options; returns (process, url)."""
    started = []

    def start(*options: str):
        port = free_port()
        target = int(vllm_server.url.rsplit(":", 1)[1])
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.fixtures.relay", str(port), str(target), *options],
            stdout=subprocess.PIPE,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))),
        )
        started.append(process)
        assert process.stdout.readline().strip() == b"ready"
        return process, f"http://127.0.0.1:{port}"

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(5)


@pytest.fixture
def relay(relay_to):
    # Dies after relaying 2 KB of a response: the headers and a few stream chunks.
    return relay_to("--cut-after", "2048")


def test_upstream_killed_mid_stream_gets_an_error_and_the_turn_is_logged_as_failed(
    gateway, openai_client, tiny_base, base_live, relay
):
    process, url = relay
    original = tiny_base.inference_url
    tiny_base.inference_url = url
    tiny_base.save(update_fields=["inference_url"])
    headers = {"X-Practicum-Trace-Id": "cut"}
    ask = {"model": "m", "messages": [{"role": "user", "content": "Write a long essay"}], "temperature": 0}
    stream = openai_client.chat.completions.create(**ask, stream=True, max_tokens=600, extra_headers=headers)
    received = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            received.append(chunk)
    assert received, "the cut came before the first chunk, not mid-stream"
    process.wait(5)
    # Now the upstream is gone altogether: 503, and the exchange is still logged.
    with pytest.raises(openai.InternalServerError) as exc:
        openai_client.chat.completions.create(**ask, max_tokens=5, extra_headers=headers)
    assert exc.value.status_code == 503
    gateway.drain()
    trace = Trace.objects.get(external_id="cut")
    messages = list(trace.messages.order_by("position"))
    assert [m.role for m in messages] == ["user", "assistant", "assistant"]
    cut, down = messages[1], messages[2]
    assert cut.finish_reason == "error" and cut.raw["practicum"]["error"]["mid_stream"]
    assert cut.content.startswith("".join(c.choices[0].delta.content or "" for c in received))
    assert down.finish_reason == "error" and down.raw["practicum"]["error"]["status"] == 503
    assert trace.status == "error"

    # The upstream is back: a retry continues the same trace (failed turns are not history).
    tiny_base.inference_url = original
    tiny_base.save(update_fields=["inference_url"])
    ok = openai_client.chat.completions.create(**ask, max_tokens=3, extra_headers=headers)
    gateway.drain()
    trace.refresh_from_db()
    assert trace.status == "ok" and trace.message_count == 4
    assert trace.messages.order_by("position").last().response_id == ok.id


def test_client_disconnect_mid_stream_leaves_a_marked_partial_turn(gateway, api_key, tiny_base, base_live, relay_to):
    # Through a relay that paces the stream (10 ms a piece): the tiny model would otherwise
    # finish all 900 tokens before a loaded machine's gateway notices the client has gone.
    _, url = relay_to("--delay-ms", "10")
    original = tiny_base.inference_url
    tiny_base.inference_url = url
    tiny_base.save(update_fields=["inference_url"])
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Go on forever"}],
        "stream": True,
        "max_tokens": 900,
        "temperature": 0,
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {api_key}", "X-Practicum-Trace-Id": "left"}
    with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body, headers=headers) as r:
        lines = r.iter_lines()
        # Leave once a piece of the answer has arrived (the first chunk may carry only the
        # role): the gateway keeps what it relayed, so the partial turn holds some tokens.
        for line in lines:
            if line.startswith("data: "):
                chunk = json.loads(line[6:])
                assert chunk["object"] == "chat.completion.chunk"
                if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    break
    time.sleep(0.5)
    gateway.drain()
    _, partial = trace_messages("left")
    tiny_base.inference_url = original
    tiny_base.save(update_fields=["inference_url"])
    assert partial.finish_reason == "client_disconnect"
    assert partial.raw["practicum"]["status"] == "partial"
    assert 0 < len(partial.token_ids) < 900


def test_structured_output_passes_through_as_valid_json(gateway, openai_client, base_live):
    schema = {
        "type": "object",
        "properties": {"reward": {"type": "integer", "minimum": 0, "maximum": 1}},
        "required": ["reward"],
        "additionalProperties": False,
    }
    r = openai_client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Score it"}],
        max_tokens=30,
        extra_body={"structured_outputs": {"json": schema}},
    )
    # Random weights favour whitespace, which the JSON grammar allows between tokens (this
    # vLLM takes `disable_any_whitespace` only as a server option), so the answer may stop at
    # the token limit: it is JSON as far as it goes, and whole when it stopped by itself.
    content = r.choices[0].message.content
    assert content.lstrip().startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert json.loads(content)["reward"] in (0, 1)
    r = openai_client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Score it"}],
        max_tokens=30,
        response_format={"type": "json_schema", "json_schema": {"name": "score", "schema": schema, "strict": True}},
    )
    assert r.choices[0].message.content.lstrip().startswith("{")
