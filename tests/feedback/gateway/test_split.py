"""The gateway's split of a deployment's traffic during a progressive release, through the real
`openai` client: each conversation is served by one version from its first call to its last
(keyed by its session id, or for a stitched one by its opening), the share decides which, and
every trace says which version served it and whether it was the canary."""

from __future__ import annotations

import pytest

from feedback.gateway.split import conversation_bucket, conversation_key, serves_candidate
from feedback.models import Message, Trace
from training.serving.services import model_version_create
from training.serving.splits import canary_split_clear, canary_split_set

pytestmark = [pytest.mark.postgres]


@pytest.fixture
def candidate(fake_live, tmp_path, chat_upstream):
    """A LoRA candidate over the fake base; the upstream answers as whichever model is asked."""
    from tests.promotion.conftest import make_adapter_folder

    version = model_version_create(
        name="fake-v2",
        base_model=fake_live.base_model,
        kind="lora",
        path=make_adapter_folder(tmp_path / "v2"),
        parent=fake_live,
    )
    chat_upstream.reply = lambda request: {"content": f"answer from {request['model']}", "model": request["model"]}
    return version


def sessions_by_side(share: float, count: int = 4) -> tuple[list[str], list[str]]:
    """Session ids whose conversations the candidate serves at `share`, and ones it does not."""
    inside, outside, i = [], [], 0
    while len(inside) < count or len(outside) < count:
        session = f"customer-{i}"
        bucket = conversation_bucket(conversation_key(session=session, trace_key=None, api_key_id=None, messages=[]))
        (inside if bucket < share else outside).append(session)
        i += 1
    return inside[:count], outside[:count]


def chat(client, session: str | None, history: list[dict]) -> str:
    headers = {"X-Practicum-Session-Id": session} if session else {}
    reply = client.chat.completions.create(model="any", messages=history, extra_headers=headers)
    text = reply.choices[0].message.content
    history.append({"role": "assistant", "content": text})
    return text


def test_each_conversation_keeps_its_version_and_its_trace_says_so(
    gateway, openai_client, deployment, fake_live, candidate, chat_upstream
):
    canary_split_set(deployment=deployment, version=candidate, share=0.25, rollout_id=7)
    inside, outside = sessions_by_side(0.25)
    histories = {s: [{"role": "user", "content": f"hello from {s}"}] for s in inside + outside}
    for turn in range(3):
        for session, history in histories.items():
            text = chat(openai_client, session, history)
            expected = candidate.name if session in inside else fake_live.name
            assert text == f"answer from {expected}", (session, turn)
            history.append({"role": "user", "content": f"and then {turn}"})
    gateway.drain()
    for session in inside + outside:
        trace = Trace.objects.get(deployment=deployment, session_id=session)
        canary = session in inside
        served = candidate if canary else fake_live
        assert trace.model_version_id == served.pk
        assert trace.metadata["practicum_release"] == {"rollout": 7, "canary": canary, "version": served.name}
        answers = Message.objects.filter(trace=trace, role="assistant")
        assert answers.count() == 3 and {m.model_version_id for m in answers} == {served.pk}


def test_a_wider_step_moves_no_conversation_in_flight(gateway, openai_client, deployment, fake_live, candidate):
    canary_split_set(deployment=deployment, version=candidate, share=0.05, rollout_id=7)
    inside, _ = sessions_by_side(0.05)
    # Conversations on live whose point the next step's share covers.
    movers = [s for s in sessions_by_side(0.5, 40)[0] if s not in inside][:4]
    histories = {s: [{"role": "user", "content": "hi"}] for s in inside + movers}
    for session, history in histories.items():
        chat(openai_client, session, history)
    canary_split_set(deployment=deployment, version=candidate, share=0.5, rollout_id=7)
    for session, history in histories.items():
        history.append({"role": "user", "content": "still there?"})
        expected = candidate.name if session in inside else fake_live.name
        assert chat(openai_client, session, history) == f"answer from {expected}", session
    # A conversation that begins now is routed by the new share.
    fresh = [s for s in sessions_by_side(0.5, 40)[0] if s not in histories][:2]
    for session in fresh:
        assert chat(openai_client, session, [{"role": "user", "content": "new"}]) == f"answer from {candidate.name}"


def test_stitched_conversations_are_sticky_by_their_opening(gateway, openai_client, deployment, fake_live, candidate):
    canary_split_set(deployment=deployment, version=candidate, share=0.5, rollout_id=3)
    served = {}
    for i in range(12):
        history = [{"role": "system", "content": "You are a support agent."}, {"role": "user", "content": f"order {i}"}]
        first = chat(openai_client, None, history)
        for turn in range(2):
            history.append({"role": "user", "content": f"more {turn}"})
            assert chat(openai_client, None, history) == first
        served[i] = first
    # The share splits them (12 openings at 50 %: both versions serve some).
    assert len(set(served.values())) == 2


def test_without_a_split_every_call_goes_live_and_no_trace_is_marked(
    gateway, openai_client, deployment, fake_live, candidate
):
    canary_split_set(deployment=deployment, version=candidate, share=0.5, rollout_id=3)
    canary_split_clear(deployment=deployment)
    inside, _ = sessions_by_side(0.5)
    for session in inside:
        assert chat(openai_client, session, [{"role": "user", "content": "x"}]) == f"answer from {fake_live.name}"
    gateway.drain()
    assert not Trace.objects.filter(metadata__has_key="practicum_release").exists()


def test_a_client_cannot_mark_its_own_trace_a_canary(gateway, openai_client, deployment, fake_live):
    openai_client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "x"}],
        metadata={"practicum_release": "canary"},
        extra_headers={"X-Practicum-Trace-Id": "mine"},
    )
    gateway.drain()
    assert "practicum_release" not in Trace.objects.get(external_id="mine").metadata


def test_the_key_prefers_the_session_then_the_trace_then_the_opening():
    class M:
        def __init__(self, role, content):
            self.role, self.content = role, content

    opening = [M("system", "s"), M("user", "u"), M("assistant", "a"), M("user", "later")]
    assert conversation_key(session="x", trace_key="t", api_key_id=1, messages=opening) == "s:x"
    assert conversation_key(session="", trace_key="t", api_key_id=1, messages=opening) == "t:t"
    key = conversation_key(session="", trace_key=None, api_key_id=1, messages=opening)
    assert key == conversation_key(session="", trace_key=None, api_key_id=1, messages=opening[:2])
    assert key != conversation_key(session="", trace_key=None, api_key_id=2, messages=opening[:2])
    # The same point in every process: the hash is fixed, not Python's salted hash().
    assert conversation_bucket("s:customer-1") == pytest.approx(conversation_bucket("s:customer-1"))
    assert 0 <= conversation_bucket("anything") < 1


def test_a_pin_holds_a_conversation_to_its_version():
    assert serves_candidate(key="a", share=0.99, pinned=10, live_id=10, candidate_id=20) is False
    assert serves_candidate(key="a", share=0.0, pinned=20, live_id=10, candidate_id=20) is True
    # A pin to a version neither side serves now (an earlier release's) is not followed.
    assert serves_candidate(key="a", share=0.99, pinned=5, live_id=10, candidate_id=20) is True


def test_share_fractions_follow_the_share():
    keys = [f"s:c{i}" for i in range(4000)]
    for share in (0.05, 0.25):
        taken = sum(conversation_bucket(k) < share for k in keys) / len(keys)
        assert abs(taken - share) < 0.02, (share, taken)


def test_with_several_replicas_each_conversation_keeps_its_version_whichever_replica_answers(
    gateway, openai_client, deployment, fake_live, candidate, chat_upstream
):
    from tests.fixtures.chat_upstream import ChatUpstream
    from training.serving.services import base_model_replicas_set

    second = ChatUpstream(reply=chat_upstream.reply)
    try:
        base_model_replicas_set(base=fake_live.base_model, urls=[second.url])
        canary_split_set(deployment=deployment, version=candidate, share=0.25, rollout_id=5)
        inside, outside = sessions_by_side(0.25, 6)
        histories = {s: [{"role": "user", "content": f"hi {s}"}] for s in inside + outside}
        for turn in range(4):
            for session, history in histories.items():
                expected = candidate.name if session in inside else fake_live.name
                assert chat(openai_client, session, history) == f"answer from {expected}", (session, turn)
                history.append({"role": "user", "content": "go on"})
        # Both replicas answered, for both versions.
        for upstream in (chat_upstream, second):
            assert {r["model"] for r in upstream.requests} == {candidate.name, fake_live.name}
    finally:
        second.close()
