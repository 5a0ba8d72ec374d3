"""Conversation stitching: a harness that sends no trace id, through the real openai client.

The upstream is a scripted OpenAI-compatible server (tests/fixtures/chat_upstream.py): an
agent that looks orders up with a tool, and a simulated customer with its own system prompt,
both served by the same deployment, as an agent harness with an LLM-played user runs them.
"""

from __future__ import annotations

import json
import re

import openai
import pytest

from feedback.models import Trace
from tests.factories import user_with_role
from tests.feedback.conftest import TOOLS

pytestmark = pytest.mark.postgres

AGENT = "You are Acme's support agent."
CUSTOMER = "You play a customer of Acme. Ask about your orders, one question at a time."
CUSTOMER_LINES = ["Where is my order A1?", "Thanks, and order A2?", "Bye."]


def scripted_model(request: dict) -> dict:
    messages = request["messages"]
    last = messages[-1]
    if messages[0]["content"] == CUSTOMER:
        return {"content": CUSTOMER_LINES[sum(1 for m in messages if m["role"] == "assistant")]}
    if last["role"] == "tool":
        return {"content": f"Order {json.loads(last['content'])['order_id']} has shipped."}
    if "refund" in last["content"]:
        return {"content": "Your refund for B1 is on its way."}
    if match := re.search(r"order (\w+)\?", last["content"]):
        order = match.group(1)
        call = {"name": "lookup_order", "arguments": json.dumps({"order_id": order})}
        return {"content": None, "tool_calls": [{"id": f"call_{order}", "type": "function", "function": call}]}
    return {"content": "Happy to help with that."}


def agent_turn(client, history: list[dict], *, stream_text: bool = False) -> str:
    """What a harness does for one user message: call, run the tools, call again, until the
    agent answers in text. `history` grows in place, as the harness keeps it."""
    while True:
        after_tool = history[-1]["role"] == "tool"
        if stream_text and after_tool:
            chunks = client.chat.completions.create(model="agent", messages=history, tools=TOOLS, stream=True)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            history.append({"role": "assistant", "content": text})
            return text
        message = client.chat.completions.create(model="agent", messages=history, tools=TOOLS).choices[0].message
        history.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        for call in message.tool_calls:
            order = json.loads(call.function.arguments)["order_id"]
            result = json.dumps({"order_id": order, "status": "shipped"})
            history.append({"role": "tool", "tool_call_id": call.id, "content": result})


def customer_turn(client, own: list[dict], agent_said: str) -> str:
    """The simulated customer: its own conversation, where the agent's words are the user's."""
    own.append({"role": "user", "content": agent_said})
    text = client.chat.completions.create(model="customer-sim", messages=own).choices[0].message.content
    own.append({"role": "assistant", "content": text})
    return text


def shown(trace: Trace) -> list[tuple]:
    """The trace's messages as a person reads them: role, text, tool call ids; failed turns marked."""
    out = []
    for m in trace.messages.order_by("position"):
        calls = tuple(c["id"] for c in m.tool_calls or [])
        out.append((m.role, m.content, calls, m.tool_call_id) if m.finish_reason != "error" else ("FAILED",))
    return out


def as_shown(history: list[dict]) -> list[tuple]:
    return [
        (
            m["role"],
            m.get("content") or "",
            tuple(c["id"] for c in m.get("tool_calls") or []),
            m.get("tool_call_id", ""),
        )
        for m in history
    ]


def test_an_unmodified_harness_gets_one_trace_per_conversation(
    gateway, openai_client, fake_live, chat_upstream, deployment, client
):
    chat_upstream.reply = scripted_model
    retrying = openai_client.with_options(max_retries=1)
    a = [{"role": "system", "content": AGENT}]
    b = [{"role": "system", "content": AGENT}]
    sim = [{"role": "system", "content": CUSTOMER}]

    # Two conversations with the same system prompt, interleaved turn by turn; the customer of
    # the first is played by another model through the same deployment.
    a.append({"role": "user", "content": customer_turn(openai_client, sim, "Hello, how can I help you?")})
    b.append({"role": "user", "content": "Where is my order B1?"})
    agent_turn(openai_client, a, stream_text=True)
    agent_turn(openai_client, b)
    a.append({"role": "user", "content": customer_turn(openai_client, sim, a[-1]["content"])})
    b.append({"role": "user", "content": "Can I get a refund?"})
    chat_upstream.fail_next(503)  # the SDK retries the same request
    agent_turn(retrying, b)
    agent_turn(openai_client, a, stream_text=True)
    # B's harness rewinds to before the refund question and asks something else instead.
    edited = [*b[:5], {"role": "user", "content": "Actually, can I change the address?"}]
    agent_turn(openai_client, edited)
    # And a harness that summarises: the history is rewritten from its start.
    summarised = [
        {"role": "system", "content": AGENT},
        {"role": "user", "content": "(Earlier: the customer asked about order B1 and a refund.)"},
        {"role": "assistant", "content": "Your refund for B1 is on its way."},
        {"role": "user", "content": "Thank you!"},
    ]
    agent_turn(openai_client, summarised)
    gateway.drain()

    traces = {t.id: t for t in Trace.objects.filter(deployment=deployment)}
    assert len(traces) == 5, sorted(t.external_id for t in traces.values())
    by_first_words = {shown(t)[1][1]: t for t in traces.values()}
    trace_a = by_first_words["Where is my order A1?"]
    trace_sim = by_first_words["Hello, how can I help you?"]
    assert shown(trace_a) == as_shown(a)
    assert shown(trace_sim) == as_shown(sim)
    assert trace_a.model_name == "agent" and trace_sim.model_name == "customer-sim"

    roots_b = [t for t in traces.values() if shown(t)[1][1] == "Where is my order B1?"]
    trace_b = next(t for t in roots_b if t.forked_from_id is None)
    fork = next(t for t in roots_b if t.forked_from_id is not None)
    # The failed first try stays, marked; the retry's answer follows it; nothing repeats.
    assert shown(trace_b) == [*as_shown(b[:6]), ("FAILED",), *as_shown(b[6:])]
    assert (fork.forked_from_id, fork.forked_at, shown(fork)) == (trace_b.id, 5, as_shown(edited))
    rewritten = by_first_words["(Earlier: the customer asked about order B1 and a refund.)"]
    assert rewritten.forked_from_id == trace_b.id and rewritten.metadata["rewritten_history"] is True
    assert shown(rewritten) == as_shown(summarised)

    # The trace pages show the forks as such, both ways.
    client.force_login(user_with_role("operator", "olga"))
    page = client.get(f"/traces/{fork.id}/").content.decode()
    assert f'A fork of <a href="/traces/{trace_b.id}/">{trace_b.external_id}</a>: the same 5 messages' in page
    parent_page = client.get(f"/traces/{trace_b.id}/").content.decode()
    assert f'<a href="/traces/{fork.id}/">{fork.external_id}</a> (after 5)' in parent_page
    assert f'<a href="/traces/{rewritten.id}/">' in parent_page and "Your refund for B1 is on its way." in parent_page

    # Each assistant turn keeps its own serving data, as with a trace sent with a header.
    for message in trace_a.messages.filter(role="assistant"):
        assert message.response_id.startswith("chatcmpl-") and message.model_version_id == fake_live.id
        assert message.token_logprobs and message.latency_ms is not None and message.usage
    assert trace_a.assistant_turn_count == 4 and trace_a.tool_call_count == 2
    assert trace_b.message_count == len(b) + 1  # the marked failed turn


def test_conversations_that_open_identically_keep_a_trace_each(gateway, openai_client, fake_live, deployment):
    histories = [[{"role": "system", "content": AGENT}, {"role": "user", "content": "Hi"}] for _ in range(2)]
    for history in histories:  # the same words and the same answer
        history.append({"role": "assistant", "content": agent_turn(openai_client, history[:])})
    for i, history in enumerate(histories):
        history.append({"role": "user", "content": f"My name is {'AB'[i]}."})
        history.append({"role": "assistant", "content": agent_turn(openai_client, history[:])})
    gateway.drain()
    traces = list(Trace.objects.filter(deployment=deployment))
    assert sorted(shown(t)[3][1] for t in traces) == ["My name is A.", "My name is B."]
    assert all(t.message_count == 5 and t.forked_from_id is None for t in traces)


def test_with_n_choices_the_conversation_continues_in_the_fork_of_the_choice_kept(
    gateway, openai_client, fake_live, deployment
):
    history = [{"role": "system", "content": AGENT}, {"role": "user", "content": "Hi"}]
    response = openai_client.chat.completions.create(model="agent", messages=history, n=2)
    kept = response.choices[1].message
    assert kept.content == "hello (option 2)"
    history += [kept.model_dump(exclude_none=True), {"role": "user", "content": "Thanks"}]
    openai_client.chat.completions.create(model="agent", messages=history)
    gateway.drain()
    main = Trace.objects.get(deployment=deployment, forked_from__isnull=True)
    fork = Trace.objects.get(deployment=deployment, forked_from=main)
    assert [m.content for m in main.messages.order_by("position")] == [AGENT, "Hi", "hello"]
    assert [m.content for m in fork.messages.order_by("position")] == [
        AGENT,
        "Hi",
        "hello (option 2)",
        "Thanks",
        "hello",
    ]
    assert fork.forked_at == 2


def test_stitching_can_be_switched_off_per_deployment_and_a_trace_id_still_wins(
    gateway, openai_client, fake_live, deployment
):
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "hello"}]
    openai_client.chat.completions.create(model="agent", messages=history[:1])
    named = openai_client.chat.completions.with_raw_response.create(
        model="agent",
        messages=[*history, {"role": "user", "content": "more"}],
        extra_body={"metadata": {"trace_id": "mine"}},
    )
    assert named.headers["x-practicum-trace-id"] == "mine"
    gateway.drain()
    assert Trace.objects.get(external_id="mine").message_count == 4
    assert Trace.objects.count() == 2

    deployment.stitch_conversations = False
    deployment.save(update_fields=["stitch_conversations"])
    Trace.objects.all().delete()
    openai_client.chat.completions.create(model="agent", messages=history[:1])
    raw = openai_client.chat.completions.with_raw_response.create(
        model="agent", messages=[*history, {"role": "user", "content": "more"}]
    )
    assert raw.headers["x-practicum-trace-id"].startswith("gw-")  # each call its own trace, named in the answer
    gateway.drain()
    assert sorted(Trace.objects.values_list("message_count", flat=True)) == [2, 4]


def test_a_call_the_client_gave_up_on_is_marked_and_the_sdks_retry_continues_the_trace(
    gateway, api_key, fake_live, chat_upstream, deployment
):
    import time

    calls = []

    def slow_first(request: dict) -> dict:
        calls.append(request)
        if len(calls) == 1:
            time.sleep(1.2)  # longer than the client waits; done before the SDK's retry (0.4 s later)
        return {"content": "hello"}

    chat_upstream.reply = slow_first
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=api_key, max_retries=1, timeout=1)
    history = [{"role": "system", "content": AGENT}, {"role": "user", "content": "Hi"}]
    answer = client.chat.completions.create(model="agent", messages=history).choices[0].message.content
    client.chat.completions.create(
        model="agent", messages=[*history, {"role": "assistant", "content": answer}, {"role": "user", "content": "Bye"}]
    )
    gateway.drain()
    assert len(calls) == 3
    trace = Trace.objects.get(deployment=deployment)
    rows = [(m.role, m.content, m.finish_reason) for m in trace.messages.order_by("position")]
    assert rows[2:] == [
        ("assistant", "hello", "client_disconnect"),  # kept, marked: the client never had it
        ("assistant", "hello", "stop"),
        ("user", "Bye", ""),
        ("assistant", "hello", "stop"),
    ]


def test_concurrent_conversations_each_become_one_trace(gateway, openai_client, fake_live, chat_upstream, deployment):
    from concurrent.futures import ThreadPoolExecutor

    chat_upstream.reply = scripted_model

    def converse(name: str) -> list[dict]:
        history = [{"role": "system", "content": AGENT}]
        for order in ("1", "2", "3"):
            history.append({"role": "user", "content": f"Where is my order {name}{order}?"})
            agent_turn(openai_client, history)
        return history

    with ThreadPoolExecutor(4) as pool:
        histories = list(pool.map(converse, ["A", "B", "C", "D"]))
    gateway.drain()
    traces = Trace.objects.filter(deployment=deployment)
    assert sorted(shown(t)[1][1] for t in traces) == [f"Where is my order {n}1?" for n in "ABCD"]
    for trace in traces:
        name = shown(trace)[1][1][18]
        assert shown(trace) == as_shown(histories["ABCD".index(name)])


def test_identical_openings_of_two_sessions_never_share_a_trace(gateway, openai_client, fake_live, deployment):
    """Two customers' conversations that open with the same words and get the same answer: each
    customer's later words stay in the trace of that customer's session (and of that key)."""
    from feedback.services.api_keys import api_key_create

    other_key = api_key_create(deployment=deployment, scopes=["ingest"]).plaintext
    other_client = openai_client.with_options(api_key=other_key)
    callers = {
        "cust-A": openai_client.with_options(default_headers={"X-Practicum-Session-Id": "cust-A"}),
        "cust-B": openai_client.with_options(default_headers={"X-Practicum-Session-Id": "cust-B"}),
        "": other_client,  # no session, another key
    }
    histories = {s: [{"role": "system", "content": AGENT}, {"role": "user", "content": "Hi"}] for s in callers}
    for session, history in histories.items():  # the same words and the same answer, A first
        history.append({"role": "assistant", "content": agent_turn(callers[session], history[:])})
    for session, history in histories.items():  # then each customer says something private
        history.append({"role": "user", "content": f"My card number is that of {session or 'the other key'}."})
        history.append({"role": "assistant", "content": agent_turn(callers[session], history[:])})
    gateway.drain()

    traces = list(Trace.objects.filter(deployment=deployment))
    assert len(traces) == 3
    for trace in traces:
        assert shown(trace) == as_shown(histories[trace.session_id]), trace.session_id
