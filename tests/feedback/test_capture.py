"""How gateway exchanges become trace messages (no server: exchanges are built directly)."""

from __future__ import annotations

import time

import pytest

from feedback.gateway.exchange import Exchange, ExchangeStatus
from feedback.gateway.recorder import Recorder
from feedback.models import Trace
from feedback.services.capture import TraceDigestCache, exchanges_record
from tests.factories import DeploymentFactory
from webapp.kernel.chat_format import parse_message


def answer(text: str, *, n: int = 1, rid: str = "chatcmpl-1") -> dict:
    return {
        "id": rid,
        "choices": [
            {
                "index": i,
                "message": {"role": "assistant", "content": f"{text}{i or ''}", "refusal": None},
                "finish_reason": "stop",
                "token_ids": [5, 6],
                "logprobs": {"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -0.25}]},
            }
            for i in range(n)
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


def exchange(deployment, messages, *, response=None, key="conv", status=ExchangeStatus.OK) -> Exchange:
    return Exchange(
        deployment_id=deployment.id,
        trace_key=key,
        explicit_trace=True,
        session_id="",
        requested_model="agent-model",
        version_id=None,
        messages=[parse_message(m, f"messages[{i}]") for i, m in enumerate(messages)],
        tools=[],
        params={"temperature": 0},
        metadata={},
        started_at=time.time(),
        latency_ms=12.5,
        status=status,
        response=response,
        error={"status": 503, "message": "down"} if status == ExchangeStatus.ERROR else None,
    )


@pytest.fixture
def deployment(db):
    return DeploymentFactory()


def contents(key: str) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in Trace.objects.get(external_id=key).messages.order_by("position")]


def test_a_resent_history_appends_only_what_is_new(deployment):
    cache = TraceDigestCache()
    u1 = {"role": "user", "content": "hi"}
    exchanges_record(exchanges=[exchange(deployment, [u1], response=answer("hello"))], cache=cache)
    # The SDK sends the answer back re-serialised (extra null fields, other key order).
    echoed = {"content": "hello", "role": "assistant", "tool_calls": None, "refusal": None}
    second = exchange(deployment, [u1, echoed, {"role": "user", "content": "more"}], response=answer("sure"))
    exchanges_record(exchanges=[second], cache=TraceDigestCache())  # a cold cache reads the stored rows
    assert contents("conv") == [("user", "hi"), ("assistant", "hello"), ("user", "more"), ("assistant", "sure")]
    trace = Trace.objects.get(external_id="conv")
    assert (trace.message_count, trace.assistant_turn_count, trace.total_tokens) == (4, 2, 10)
    last = trace.messages.order_by("position").last()
    assert (last.token_ids, last.token_logprobs, last.finish_reason, last.latency_ms) == (
        [5, 6],
        [-0.5, -0.25],
        "stop",
        12.5,
    )


def test_a_diverging_history_goes_to_one_stable_fork(deployment):
    u1 = {"role": "user", "content": "hi"}
    exchanges_record(exchanges=[exchange(deployment, [u1], response=answer("hello"))])
    edited = [u1, {"role": "assistant", "content": "HELLO"}, {"role": "user", "content": "next"}]
    exchanges_record(exchanges=[exchange(deployment, edited, response=answer("a"))])
    exchanges_record(
        exchanges=[
            exchange(
                deployment,
                [*edited, {"role": "assistant", "content": "a"}, {"role": "user", "content": "again"}],
                response=answer("b"),
            )
        ]
    )
    assert contents("conv") == [("user", "hi"), ("assistant", "hello")]  # never rewritten
    fork = Trace.objects.exclude(external_id="conv").get()
    assert fork.external_id.startswith("conv~1.") and fork.metadata["forked_from"] == "conv"
    assert [c for _, c in contents(fork.external_id)] == ["hi", "HELLO", "next", "a", "again", "b"]


def test_a_failed_turn_is_kept_marked_and_a_retry_continues_the_trace(deployment):
    u1 = {"role": "user", "content": "hi"}
    exchanges_record(exchanges=[exchange(deployment, [u1], status=ExchangeStatus.ERROR)])
    trace = Trace.objects.get()
    assert trace.status == "error"
    failed = trace.messages.get(position=1)
    assert (failed.role, failed.finish_reason, failed.raw["practicum"]["error"]["status"]) == (
        "assistant",
        "error",
        503,
    )
    exchanges_record(exchanges=[exchange(deployment, [u1], response=answer("hello"))])
    trace.refresh_from_db()
    assert trace.status == "ok" and Trace.objects.count() == 1
    assert contents("conv") == [("user", "hi"), ("assistant", ""), ("assistant", "hello")]


def test_exchanges_of_one_conversation_in_one_batch_are_written_in_order(deployment):
    u1, u2 = {"role": "user", "content": "a"}, {"role": "user", "content": "b"}
    batch = [
        exchange(deployment, [u1], response=answer("x")),
        exchange(deployment, [u1, {"role": "assistant", "content": "x"}, u2], response=answer("y")),
    ]
    exchanges_record(exchanges=batch)
    assert [c for _, c in contents("conv")] == ["a", "x", "b", "y"]


def test_a_full_queue_spills_to_disk_and_the_spill_is_written_later(transactional_db, tmp_path):
    deployment = DeploymentFactory()
    recorder = Recorder(queue_size=1, batch_size=10, spill_dir=tmp_path)
    recorder._thread = type("Busy", (), {"is_alive": lambda self: True})()  # a writer that never takes: the queue fills
    for i in range(3):
        recorder.submit(
            exchange(deployment, [{"role": "user", "content": f"m{i}"}], response=answer("ok"), key=f"k{i}")
        )
    assert recorder.stats["spilled"] == 2 and list(tmp_path.glob("spill-*.jsonl"))
    recorder._thread = None
    recorder.start()
    assert recorder.drain(10)
    recorder._replay_spills()
    recorder.stop()
    assert sorted(Trace.objects.values_list("external_id", flat=True)) == ["k0", "k1", "k2"]
    assert not list(tmp_path.glob("*.jsonl"))


def _line(deployment, key: str) -> bytes:
    import orjson

    ex = exchange(deployment, [{"role": "user", "content": key}], response=answer("ok"), key=key)
    return orjson.dumps(ex.to_json(), default=str) + b"\n"


def test_a_truncated_spill_line_is_quarantined_and_the_writer_keeps_writing(transactional_db, tmp_path):
    deployment = DeploymentFactory()
    good, cut = _line(deployment, "before"), _line(deployment, "cut")
    # A process killed mid-write (pid 999999999 is not running) left a truncated line.
    (tmp_path / "spill-999999999.jsonl").write_bytes(good + cut[: len(cut) // 2] + b"\n" + _line(deployment, "after"))
    recorder = Recorder(queue_size=100, batch_size=10, spill_dir=tmp_path)
    recorder.start()
    deadline = time.monotonic() + 10
    while list(tmp_path.glob("spill-*.jsonl")) + list(tmp_path.glob("claimed-*.jsonl")):
        assert time.monotonic() < deadline, "the spill file was never replayed"
        time.sleep(0.1)
    recorder.submit(exchange(deployment, [{"role": "user", "content": "later"}], response=answer("ok"), key="later"))
    assert recorder.drain(10), "exchanges submitted after the bad line were never written"
    health = recorder.health()
    recorder.stop()
    assert sorted(Trace.objects.values_list("external_id", flat=True)) == ["after", "before", "later"]
    (quarantine,) = tmp_path.glob("quarantine-*.jsonl")
    assert quarantine.read_bytes() == cut[: len(cut) // 2] + b"\n"
    assert (health["writer_alive"], health["quarantined"], health["queue_depth"]) == (True, 1, 0)


def test_a_spilled_exchange_that_fails_on_its_own_data_is_quarantined_and_the_rest_written(transactional_db, tmp_path):
    import orjson

    deployment, gone = DeploymentFactory(), DeploymentFactory()
    orphan = _line(gone, "orphan")  # its deployment is deleted while it waits in the spill file
    gone.delete()
    (tmp_path / "spill-999999999.jsonl").write_bytes(_line(deployment, "before") + orphan + _line(deployment, "after"))
    recorder = Recorder(queue_size=100, batch_size=10, spill_dir=tmp_path)
    recorder._replay_spills()  # one pass: not left to be retried every few seconds
    assert sorted(Trace.objects.values_list("external_id", flat=True)) == ["after", "before"]
    assert not list(tmp_path.glob("spill-*.jsonl")) + list(tmp_path.glob("claimed-*.jsonl"))
    (quarantine,) = tmp_path.glob("quarantine-*.jsonl")
    (kept,) = quarantine.read_bytes().splitlines()
    assert orjson.loads(kept)["trace_key"] == "orphan"
    assert recorder.health()["quarantined"] == 1


def test_a_writer_thread_that_ended_is_restarted_by_the_next_exchange(transactional_db, tmp_path):
    deployment = DeploymentFactory()
    recorder = Recorder(queue_size=100, batch_size=10, spill_dir=tmp_path)
    recorder.start()
    dead = recorder._thread
    recorder.submit(object())  # something the writer cannot handle: its pass fails
    deadline = time.monotonic() + 5
    while recorder.stats["writer_errors"] == 0 and dead.is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    recorder.submit(exchange(deployment, [{"role": "user", "content": "x"}], response=answer("ok"), key="x"))
    assert recorder.drain(10)
    recorder.stop()
    assert Trace.objects.filter(external_id="x").exists()


def test_a_history_older_than_the_stitching_window_starts_a_new_conversation(deployment):
    from datetime import timedelta

    from django.utils import timezone

    from feedback.models import ConversationTip
    from feedback.services.stitching import conversation_tips_expire

    def stitched(messages, text):
        ex = exchange(deployment, messages, response=answer(text), key=f"gw-{time.monotonic_ns():032x}")
        ex.explicit_trace, ex.stitch = False, True
        return ex

    u1 = {"role": "user", "content": "hi"}
    exchanges_record(exchanges=[stitched([u1], "hello")])
    follow_up = [u1, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    exchanges_record(exchanges=[stitched(follow_up, "sure")])
    assert Trace.objects.count() == 1  # within the window: one conversation
    ConversationTip.objects.update(created_at=timezone.now() - timedelta(hours=7))  # past the 6 h window
    exchanges_record(exchanges=[stitched([*follow_up, {"role": "assistant", "content": "sure"}, u1], "again")])
    assert Trace.objects.count() == 2
    assert conversation_tips_expire(now=timezone.now()) == 2 and ConversationTip.objects.count() == 1
