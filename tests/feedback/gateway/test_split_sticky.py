"""A conversation under way keeps its version whatever happens to the split around it: the
first step beginning, a wider step, the next call reaching another gateway process, a
restart, a harness trimming its history. Through the real `openai` client, against two
gateway processes on one database."""

from __future__ import annotations

import pytest

from feedback.gateway.pins import DIGEST_SIZE, Pins, key_digest
from feedback.gateway.split import conversation_bucket, conversation_key
from tests.feedback.gateway.test_split import candidate, chat, sessions_by_side  # noqa: F401 (fixture)
from training.serving.splits import canary_split_clear, canary_split_set
from webapp.kernel.chat_format import parse_message

pytestmark = [pytest.mark.postgres]


@pytest.fixture
def second_gateway(transactional_db, api_key):
    """Another gateway process's app (its own pins, its own route cache) on the same database,
    and an `openai` client for it."""
    import openai

    from feedback.gateway.app import GatewayApp, mount
    from tests.fixtures.inference import GatewayServer, _ThreadedUvicorn
    from training.inference.server import free_port
    from webapp.asgi import django_application

    app = GatewayApp(auth_ttl=0, route_ttl=0, upstream_timeout=60)
    port = free_port()
    with _ThreadedUvicorn(mount(django_application, app), port):
        server = GatewayServer(url=f"http://127.0.0.1:{port}", app=app)
        yield server, openai.OpenAI(base_url=f"{server.url}/v1", api_key=api_key, max_retries=0, timeout=60)


@pytest.fixture
def echoing(chat_upstream, candidate):  # noqa: F811
    """Each answer names its model and what it answers, so no two answers of a test are alike."""
    chat_upstream.reply = lambda request: {
        "content": f"answer from {request['model']} to {request['messages'][-1]['content']}",
        "model": request["model"],
    }
    return candidate


def served_by(text: str) -> str:
    return text.removeprefix("answer from ").split(" to ", 1)[0]


def movers(share_before: float, share_after: float, count: int = 3) -> list[str]:
    """Session ids whose point a step from `share_before` to `share_after` covers."""
    wider = sessions_by_side(share_after, 60)[0]
    return [s for s in wider if conversation_bucket(f"s:{s}") >= share_before][:count]


def stitched_movers(key_id: int, share: float, count: int = 3) -> list[list[dict]]:
    """Openings of stitched conversations whose point is below `share`."""
    out, i = [], 0
    while len(out) < count:
        opening = [{"role": "system", "content": "You are a support agent."}, {"role": "user", "content": f"order {i}"}]
        parsed = [parse_message(m, "m") for m in opening]
        key = conversation_key(session="", trace_key=None, api_key_id=key_id, messages=parsed)
        if conversation_bucket(key) < share:
            out.append(opening)
        i += 1
    return out


def key_id(deployment) -> int:
    from feedback.models import ApiKey

    return ApiKey.objects.get(deployment=deployment).pk


def test_a_conversation_in_flight_before_the_first_step_stays_live(
    gateway, openai_client, deployment, fake_live, echoing
):
    histories = {s: [{"role": "user", "content": f"hi {s}"}] for s in movers(0.0, 0.5)}
    stitched = stitched_movers(key_id(deployment), 0.5)
    for session, history in histories.items():
        assert served_by(chat(openai_client, session, history)) == fake_live.name
    for history in stitched:
        assert served_by(chat(openai_client, None, history)) == fake_live.name
    gateway.drain()
    canary_split_set(deployment=deployment, version=echoing, share=0.5, rollout_id=9)
    for session, history in histories.items():
        history.append({"role": "user", "content": "still there?"})
        assert served_by(chat(openai_client, session, history)) == fake_live.name, session
    for history in stitched:
        history.append({"role": "user", "content": "still there?"})
        assert served_by(chat(openai_client, None, history)) == fake_live.name, history[1]
    # Conversations that begin now, with the same points, are the candidate's.
    for opening in stitched_movers(key_id(deployment), 0.5, 6)[3:]:
        assert served_by(chat(openai_client, None, opening)) == echoing.name
    for session in movers(0.0, 0.5, 6)[3:]:
        assert served_by(chat(openai_client, session, [{"role": "user", "content": "new"}])) == echoing.name


def test_a_conversation_keeps_its_version_on_another_process_after_a_wider_step(
    gateway, openai_client, second_gateway, deployment, fake_live, echoing
):
    _, client_b = second_gateway
    canary_split_set(deployment=deployment, version=echoing, share=0.05, rollout_id=9)
    sessions = movers(0.05, 0.6)
    histories = {s: [{"role": "user", "content": f"hi {s}"}] for s in sessions}
    stitched = stitched_movers(key_id(deployment), 0.6, 12)
    for session, history in histories.items():
        assert served_by(chat(openai_client, session, history)) == fake_live.name
    first = [served_by(chat(openai_client, None, history)) for history in stitched]
    gateway.drain()
    canary_split_set(deployment=deployment, version=echoing, share=0.6, rollout_id=9)
    for session, history in histories.items():
        history.append({"role": "user", "content": "and now?"})
        assert served_by(chat(client_b, session, history)) == fake_live.name, session
    for history, was in zip(stitched, first, strict=True):
        history.append({"role": "user", "content": "and now?"})
        assert served_by(chat(client_b, None, history)) == was, history[1]
    # Some stitched ones began on live although the wider share covers them.
    assert fake_live.name in first


def test_a_restart_moves_no_conversation_nor_does_trimming_its_history(
    gateway, openai_client, deployment, fake_live, echoing
):
    canary_split_set(deployment=deployment, version=echoing, share=0.05, rollout_id=9)
    sessions = movers(0.05, 0.6)
    histories = {s: [{"role": "user", "content": f"hi {s}"}] for s in sessions}
    stitched = stitched_movers(key_id(deployment), 0.6, 12)
    for session, history in histories.items():
        chat(openai_client, session, history)
    first = []
    for i, history in enumerate(stitched):
        chat(openai_client, None, history)
        history.append({"role": "user", "content": f"second question {i}"})
        first.append(served_by(chat(openai_client, None, history)))
    gateway.drain()
    canary_split_set(deployment=deployment, version=echoing, share=0.6, rollout_id=9)
    gateway.app.pins = Pins(ttl=3600)  # what a restart leaves of this process's memory
    for session, history in histories.items():
        history.append({"role": "user", "content": "after the restart"})
        assert served_by(chat(openai_client, session, history)) == fake_live.name, session
    for history, was in zip(stitched, first, strict=True):
        # The harness keeps its system prompt and drops the first exchange: a new opening.
        trimmed = [history[0], *history[3:], {"role": "user", "content": "after the restart"}]
        assert served_by(chat(openai_client, None, trimmed)) == was, history[1]
    assert fake_live.name in first


def test_two_conversations_that_open_alike_across_the_first_step_keep_a_version_each(
    gateway, openai_client, deployment, fake_live, echoing
):
    opening = stitched_movers(key_id(deployment), 0.5, 1)[0]
    before = [*opening]
    assert served_by(chat(openai_client, None, before)) == fake_live.name
    gateway.drain()
    canary_split_set(deployment=deployment, version=echoing, share=0.5, rollout_id=9)
    after = [*opening]
    assert served_by(chat(openai_client, None, after)) == echoing.name
    for turn in range(2):
        before.append({"role": "user", "content": f"before, turn {turn}"})
        after.append({"role": "user", "content": f"after, turn {turn}"})
        assert served_by(chat(openai_client, None, before)) == fake_live.name
        assert served_by(chat(openai_client, None, after)) == echoing.name


def test_a_greeting_many_conversations_received_says_nothing_about_a_new_one(
    gateway, openai_client, deployment, fake_live, chat_upstream
):
    """The next call of a conversation whose first call is not logged yet (it reached another
    process a moment ago) is not claimed by other conversations' identical first answer."""
    from feedback.gateway.pins import served_version_sync

    chat_upstream.reply = lambda request: {"content": "Hello, how can I help?"}
    system = {"role": "system", "content": "You are a support agent."}
    for i in range(3):
        chat(openai_client, None, [system, {"role": "user", "content": f"order {i}"}])
    gateway.drain()

    def version_of(raw):
        return served_version_sync(
            deployment_id=deployment.pk,
            session="",
            trace_key=None,
            api_key_id=key_id(deployment),
            messages=[parse_message(m, "m") for m in raw],
        )

    logged = [
        system,
        {"role": "user", "content": "order 1"},
        {"role": "assistant", "content": "Hello, how can I help?"},
    ]
    assert version_of([*logged, {"role": "user", "content": "more"}]) == fake_live.pk
    unlogged = [system, {"role": "user", "content": "order 9"}, logged[2], {"role": "user", "content": "more"}]
    assert version_of(unlogged) is None


def test_the_pins_of_a_split_that_ended_are_dropped(gateway, openai_client, deployment, fake_live, echoing):
    canary_split_set(deployment=deployment, version=echoing, share=0.5, rollout_id=9)
    for session in sessions_by_side(0.5, 3)[0]:
        chat(openai_client, session, [{"role": "user", "content": "x"}])
    assert len(gateway.app.pins) == 3
    canary_split_clear(deployment=deployment)
    chat(openai_client, "someone", [{"role": "user", "content": "x"}])
    assert len(gateway.app.pins) == 0


def test_pin_memory_is_bounded_by_count_and_keeps_a_fixed_size_digest(monkeypatch):
    import time

    opening = "You are a support agent. " * 200  # a 5 KB system prompt
    pins = Pins(ttl=60, size=1000)
    for i in range(5000):
        pins.put(1, key_digest(f"o:1\x1e{opening}\x1e{i}"), 10)
    assert len(pins) == 1000
    assert {len(digest) for _, digest in pins._items} == {DIGEST_SIZE}
    assert pins.get(1, key_digest(f"o:1\x1e{opening}\x1e4999")) == 10
    assert pins.get(1, key_digest(f"o:1\x1e{opening}\x1e0")) is None  # the least recently used went first
    # Expired pins are purged as new ones come, not only when read.
    later = time.monotonic() + 61
    monkeypatch.setattr(time, "monotonic", lambda: later)
    pins.put(1, key_digest("s:new"), 20)
    assert len(pins) == 1
    assert Pins(ttl=0).get(1, key_digest("a")) is None


def test_a_hundred_thousand_pins_of_long_openings_take_under_32_mib():
    import tracemalloc

    opening = "You are a support agent. " * 200
    tracemalloc.start()
    try:
        pins = Pins(ttl=3600, size=100_000)
        for i in range(100_000):
            pins.put(1, key_digest(f"o:1\x1e{opening}\x1e{i}"), 10)
        used, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(pins) == 100_000 and used < 32 * 2**20, used


def test_a_pin_belongs_to_one_release():
    pins = Pins(ttl=60)
    pins.follow(1, 7)
    pins.put(1, key_digest("s:a"), 10)
    pins.put(2, key_digest("s:a"), 11)
    pins.follow(1, 7)
    assert pins.get(1, key_digest("s:a")) == 10
    pins.follow(1, 8)  # another release's split
    assert pins.get(1, key_digest("s:a")) is None
    assert pins.get(2, key_digest("s:a")) == 11
